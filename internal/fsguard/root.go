package fsguard

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A root of its own (Policy.Root). Landlock governs reading, writing and
// making files, not their owners, modes or times, and the 9p server
// keeps the capabilities to change those on any file: a QEMU that walked
// ".." up from its share, or chrooted out of a chroot, could give the
// host's files to another user. So the confining thread also moves into
// a mount namespace of its own whose root is a new tmpfs holding only
// what the Rules name, each bound at its own path: there is nothing
// else to name, by any path. Rules that only read are bound read-only.
//
// Every mount stays a slave of the host's: what the host mounts later
// beneath a share's own shared source (a container's rootfs, a volume)
// appears in the share; nothing QEMU could mount goes back. The host
// sees only the empty directory Root; nothing is left to unmount when
// QEMU is gone, as the namespace ends with its last process.

// enterRoot moves the calling thread into a new mount namespace rooted
// at a tmpfs on p.Root (which must be an empty directory) holding p's
// rules' paths, workdir (made empty) and /proc.
func enterRoot(p Policy) error {
	// unshare(CLONE_NEWNS): this thread only (Go locked it; it implies
	// CLONE_FS, so the thread's root and working directory are its own).
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("root: new mount namespace: %w", err)
	}
	// mount --make-rslave /
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("root: making the mounts slaves: %w", err)
	}
	binds, err := cloneRules(p.Rules)
	if err != nil {
		return err
	}
	defer func() {
		for _, b := range binds {
			unix.Close(b.fd)
		}
	}()
	// mount -t tmpfs -o nosuid,nodev,noexec,mode=0755 hull-root ROOT
	if err := unix.Mount("hull-root", p.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("root: mounting a tmpfs on %s: %w", p.Root, err)
	}
	if err := linkTopLevel(p.Root); err != nil {
		return err
	}
	if p.Workdir != "" {
		// open to a process that is not root (AsUser): it is empty
		if err := os.MkdirAll(filepath.Join(p.Root, p.Workdir), 0o755); err != nil {
			return fmt.Errorf("root: working directory: %w", err)
		}
	}
	for _, b := range binds {
		if err := b.attach(p.Root); err != nil {
			return err
		}
	}
	// QEMU's 9p server changes modes through /proc/self/fd/N: only the
	// process directories (subset=pid), and only its own user's
	// (hidepid=invisible; QEMU is not root, AsUser, and has no
	// CAP_SYS_PTRACE): not what other processes run, with what arguments.
	procDir := filepath.Join(p.Root, "proc")
	if err := os.MkdirAll(procDir, 0o555); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if err := unix.Mount("proc", procDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "subset=pid,hidepid=invisible"); err != nil {
		return fmt.Errorf("root: mounting /proc: %w", err)
	}
	// cd ROOT && pivot_root . . && umount -l . (the host's root goes)
	if err := unix.Chdir(p.Root); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("root: pivot_root into %s: %w", p.Root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("root: detaching the host's root: %w", err)
	}
	// The tmpfs holds only mount points now.
	// mount -o remount,bind,ro,nosuid,nodev,noexec /
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("root: making it read-only: %w", err)
	}
	return unix.Chdir("/")
}

// bind is a rule's path, cloned from the host's namespace before the
// tmpfs hides anything, to be attached at the same path in the root.
type bind struct {
	path string
	fd   int
	dir  bool
}

// cloneRules clones each rule's path (recursively, following a final
// symlink, as Landlock's rule does), read-only unless the rule writes,
// nosuid, and nodev unless it is a device. A rule beneath another's path
// is reached through that one's bind and needs none of its own, unless
// it writes where that one only reads. /proc is the root's own.
func cloneRules(rules []Rule) ([]bind, error) {
	rules = slices.Clone(rules)
	slices.SortFunc(rules, func(a, b Rule) int { return strings.Compare(a.Path, b.Path) })
	var binds []bind
	var bound []Rule
	for _, r := range rules {
		if r.Path == "/proc" || strings.HasPrefix(r.Path, "/proc/") || !filepath.IsAbs(r.Path) {
			continue
		}
		if slices.ContainsFunc(bound, func(b Rule) bool { return beneath(r.Path, b.Path) && writes(b.Access) == writes(r.Access) }) {
			continue
		}
		b, err := cloneRule(r)
		if err != nil {
			for _, b := range binds {
				unix.Close(b.fd)
			}
			return nil, err
		}
		binds = append(binds, b)
		bound = append(bound, r)
	}
	return binds, nil
}

func cloneRule(r Rule) (bind, error) {
	// mount --rbind PATH <detached>
	fd, err := unix.OpenTree(unix.AT_FDCWD, r.Path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return bind{}, fmt.Errorf("root: binding %s: %w", r.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return bind{}, fmt.Errorf("root: %s: %w", r.Path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFCHR && t != unix.S_IFBLK {
		attr.Attr_set |= unix.MOUNT_ATTR_NODEV
	}
	if !writes(r.Access) {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	// mount -o remount,bind,nosuid[,nodev][,ro] on every mount of it
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return bind{}, fmt.Errorf("root: binding %s: mount_setattr: %w", r.Path, err)
	}
	return bind{path: r.Path, fd: fd, dir: st.Mode&unix.S_IFMT == unix.S_IFDIR}, nil
}

// attach makes b's mount point in root (what the tmpfs lacks of its
// path; through an earlier bind it already exists) and moves b onto it.
func (b bind) attach(root string) error {
	target := filepath.Join(root, b.path)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("root: mount point for %s: %w", b.path, err)
	}
	if b.dir {
		if err := os.Mkdir(target, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("root: mount point for %s: %w", b.path, err)
		}
	} else if f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o444); err == nil {
		f.Close()
	} else if !os.IsExist(err) {
		return fmt.Errorf("root: mount point for %s: %w", b.path, err)
	}
	// mount --move <detached> TARGET
	if err := unix.MoveMount(b.fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("root: attaching %s: %w", b.path, err)
	}
	return nil
}

// linkTopLevel makes the host's top-level symlinks again in root: on a
// merged /usr, /lib64 (the ELF interpreter's directory), /lib and /bin
// point into /usr, which a rule binds.
func linkTopLevel(root string) error {
	ents, err := os.ReadDir("/")
	if err != nil {
		return fmt.Errorf("root: %w", err)
	}
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		dest, err := os.Readlink("/" + e.Name())
		if err != nil {
			return fmt.Errorf("root: %w", err)
		}
		if err := os.Symlink(dest, filepath.Join(root, e.Name())); err != nil {
			return fmt.Errorf("root: %w", err)
		}
	}
	return nil
}

func beneath(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func writes(a Access) bool { return a&unix.LANDLOCK_ACCESS_FS_WRITE_FILE != 0 }
