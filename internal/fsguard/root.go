package fsguard

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
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
// rules' paths, workdir (made empty) and /proc. Inside the tmpfs every
// path is walked by descriptors (internal/hostfs): no symlink is
// followed and nothing is made inside a bind (a share is the guest's).
func enterRoot(p Policy) error {
	// unshare(CLONE_NEWNS): this thread only (Go locked it; it implies
	// CLONE_FS, so the thread's root and working directory are its own).
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("root: new mount namespace: %w", err)
	}
	// mount --make-rslave /: nothing done here propagates to the host
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
	// mount -t tmpfs -o nosuid,nodev,noexec,mode=0755,size=1m hull-root ROOT
	root, err := newMount("tmpfs", "hull-root", [][2]string{{"mode", "0755"}, {"size", "1m"}})
	if err != nil {
		return err
	}
	defer unix.Close(root)
	if err := attachAt(root, p.Root); err != nil {
		return err
	}
	if err := linkTopLevel(root); err != nil {
		return err
	}
	if p.Workdir != "" {
		// open to a process that is not root (AsUser): it is empty
		wd, err := mkdirAll(p.Root, p.Workdir, 0o755)
		if err != nil {
			return fmt.Errorf("root: working directory: %w", err)
		}
		unix.Close(wd)
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
	proc, err := newMount("proc", "proc", [][2]string{{"subset", "pid"}, {"hidepid", "invisible"}})
	if err != nil {
		return err
	}
	defer unix.Close(proc)
	procDir, err := mkdirAll(p.Root, "/proc", 0o555)
	if err != nil {
		return fmt.Errorf("root: /proc: %w", err)
	}
	defer unix.Close(procDir)
	if err := hostfs.Attach(proc, procDir); err != nil {
		return fmt.Errorf("root: mounting /proc: %w", err)
	}
	// cd ROOT && pivot_root . . && umount -l . (the host's root goes)
	if err := unix.Fchdir(root); err != nil {
		return fmt.Errorf("root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("root: pivot_root into %s: %w", p.Root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("root: detaching the host's root: %w", err)
	}
	// The tmpfs holds only mount points now.
	if err := hostfs.SetReadOnly(root); err != nil {
		return fmt.Errorf("root: making it read-only: %w", err)
	}
	return unix.Chdir("/")
}

// newMount is a new, detached mount of a file system of type fstype
// with opts, nosuid, nodev and noexec.
func newMount(fstype, source string, opts [][2]string) (int, error) {
	// fsopen, fsconfig (source, each option), create, fsmount
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("root: new %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for _, o := range append([][2]string{{"source", source}}, opts...) {
		if err := unix.FsconfigSetString(fs, o[0], o[1]); err != nil {
			return -1, fmt.Errorf("root: %s option %s=%s: %w", fstype, o[0], o[1], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("root: new %s: %w", fstype, err)
	}
	mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("root: new %s: %w", fstype, err)
	}
	return mfd, nil
}

// attachAt attaches the detached mount mfd on dir, a directory the
// host made (its last component is not followed).
func attachAt(mfd int, dir string) error {
	tfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("root: %s: %w", dir, err)
	}
	defer unix.Close(tfd)
	if err := hostfs.Attach(mfd, tfd); err != nil {
		return fmt.Errorf("root: mounting on %s: %w", dir, err)
	}
	return nil
}

// mkdirAll makes path (absolute, as seen from the new root; "/" is the
// root itself) and its missing parents below root, in the tmpfs alone,
// and opens it (O_PATH).
func mkdirAll(root, path string, mode uint32) (int, error) {
	rel := strings.TrimPrefix(filepath.Clean(path), "/")
	if rel == "" {
		return hostfs.OpenAnchor(root)
	}
	return hostfs.MkdirAll(root, rel, mode)
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
// nosuid, nodev unless it is a device, each mount a slave of the host's
// (so what the host binds later beneath a share appears in it). A rule
// beneath another's path is reached through that one's bind and needs
// none of its own, unless it writes where that one only reads (or the
// reverse). /proc is the root's own. A path through one of the host's
// top-level symlinks is bound where that leads (linkTopLevel makes the
// symlink again).
func cloneRules(rules []Rule) ([]bind, error) {
	rules = slices.Clone(rules)
	for i := range rules {
		rules[i].Path = throughTopLevel(rules[i].Path)
	}
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
	src, err := unix.Open(r.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return bind{}, fmt.Errorf("root: %s: %w", r.Path, err)
	}
	defer unix.Close(src)
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return bind{}, fmt.Errorf("root: %s: %w", r.Path, err)
	}
	t := st.Mode & unix.S_IFMT
	fd, err := hostfs.Clone(src, hostfs.BindOptions{RecursiveReadOnly: !writes(r.Access), Slave: true,
		Devices: t == unix.S_IFCHR || t == unix.S_IFBLK})
	if err != nil {
		return bind{}, fmt.Errorf("root: binding %s: %w", r.Path, err)
	}
	return bind{path: r.Path, fd: fd, dir: t == unix.S_IFDIR}, nil
}

// attach moves b onto its mount point in the tmpfs on root: found there
// if an earlier bind holds its path (without following a symlink, which
// a guest may have made in a share), otherwise made in the tmpfs alone
// (never inside a bind).
func (b bind) attach(root string) error {
	rel := strings.TrimPrefix(filepath.Clean(b.path), "/")
	tfd, err := hostfs.Open(root, rel, unix.O_PATH, false)
	if errors.Is(err, unix.ENOENT) {
		tfd, err = makeMountPoint(root, rel, b.dir)
	}
	if err != nil {
		return fmt.Errorf("root: mount point for %s: %w", b.path, err)
	}
	defer unix.Close(tfd)
	if err := hostfs.Attach(b.fd, tfd); err != nil {
		return fmt.Errorf("root: attaching %s: %w", b.path, err)
	}
	return nil
}

// makeMountPoint makes rel (a directory, or an empty file) and its
// missing parents in the tmpfs on root, and opens it.
func makeMountPoint(root, rel string, dir bool) (int, error) {
	if dir {
		return mkdirAll(root, "/"+rel, 0o755)
	}
	pfd, err := mkdirAll(root, filepath.Dir("/"+rel), 0o755)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	name := filepath.Base(rel)
	// touch NAME (relative to its parent's descriptor; never a symlink)
	fd, err := unix.Openat(pfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_RDONLY|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return -1, err
	}
	unix.Close(fd)
	return hostfs.OpenAt(pfd, name, unix.O_PATH, true)
}

// linkTopLevel makes the host's top-level symlinks again in the root:
// on a merged /usr, /lib64 (the ELF interpreter's directory), /lib and
// /bin point into /usr, which a rule binds.
func linkTopLevel(rootfd int) error {
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
		// ln -s DEST NAME (relative to the root's descriptor)
		if err := unix.Symlinkat(dest, rootfd, e.Name()); err != nil {
			return fmt.Errorf("root: /%s: %w", e.Name(), err)
		}
	}
	return nil
}

// throughTopLevel is path with its first component replaced by where it
// leads, if that is a symlink of the host's (/bin/qemu-system-x86_64 is
// /usr/bin/qemu-system-x86_64 on a merged /usr).
func throughTopLevel(path string) string {
	first, rest, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	dest, err := os.Readlink("/" + first)
	if err != nil || first == "" {
		return path
	}
	if !filepath.IsAbs(dest) {
		dest = "/" + dest
	}
	return filepath.Join(dest, rest)
}

func beneath(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

func writes(a Access) bool { return a&unix.LANDLOCK_ACCESS_FS_WRITE_FILE != 0 }
