package hostfs

import (
	"fmt"
	"strconv"

	"github.com/hull-runtime/hull/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Identity names one mount for good: what the state records when the
// mount is made, and what release looks for, wherever the mount point has
// moved since.
type Identity struct {
	// ID is the unique mount id (statx STATX_MNT_ID_UNIQUE, Linux 6.8):
	// never reused while the system runs. 0 on older kernels, where
	// OldID, Dev and Ino together name the mount (Same).
	ID uint64
	// OldID is the mount id /proc/self/mountinfo shows (statx
	// STATX_MNT_ID); reused after the mount is gone, so only a hint.
	OldID uint64
	// Dev and Ino are the mount's root (device and inode).
	Dev, Ino uint64
}

// MountIdentity returns the identity of the mount whose root fd is, and
// whether fd is a mount's root at all (STATX_ATTR_MOUNT_ROOT).
func MountIdentity(fd int) (Identity, bool, error) {
	var st unix.Statx_t
	// stat --format=%m (the mount id), on the descriptor itself
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID, &st); err != nil {
		return Identity{}, false, fmt.Errorf("statx: %w", err)
	}
	id := Identity{OldID: st.Mnt_id, Dev: unix.Mkdev(st.Dev_major, st.Dev_minor), Ino: st.Ino}
	root := st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID_UNIQUE, &st); err != nil {
		return Identity{}, false, fmt.Errorf("statx: %w", err)
	}
	if st.Mask&unix.STATX_MNT_ID_UNIQUE != 0 {
		id.ID = st.Mnt_id
	}
	return id, root, nil
}

// Same says whether got (just read) is the mount recorded as id: by
// unique id where the kernel has them, else by mountinfo id and the
// root's device and inode.
func (id Identity) Same(got Identity) bool {
	if id.ID != 0 && got.ID != 0 {
		return id.ID == got.ID
	}
	return id.OldID == got.OldID && id.Dev == got.Dev && id.Ino == got.Ino
}

// BindOptions say how Clone configures a copy.
type BindOptions struct {
	// ReadOnly makes the top mount read-only (the `ro` of a runc bind).
	ReadOnly bool
	// RecursiveReadOnly makes every mount of the copy read-only (`rro`).
	RecursiveReadOnly bool
	// Slave keeps the copy a slave of the source's mounts (`rslave`):
	// what the host mounts under a shared source later appears in it.
	// Without it the copy is private.
	Slave bool
	// Devices leaves the copy's device nodes usable (no nodev): a bind
	// of /dev/null or /dev/kvm.
	Devices bool
}

// Clone returns a detached copy of the mount tree at srcfd (recursive, as
// `mount --rbind`), every mount of it nosuid, nodev (unless o.Devices),
// private (or a slave, o.Slave) and read-only as o asks.
func Clone(srcfd int, o BindOptions) (int, error) {
	// mount --rbind SRC <detached> (open_tree(2) OPEN_TREE_CLONE)
	mfd, err := unix.OpenTree(srcfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return -1, fmt.Errorf("open_tree: %w", err)
	}
	// mount -o remount,bind,nosuid,nodev + --make-rprivate (--make-rslave), on every mount
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if o.Devices {
		attr.Attr_set &^= unix.MOUNT_ATTR_NODEV
	}
	if o.Slave {
		attr.Propagation = unix.MS_SLAVE
	}
	if err := unix.MountSetattr(mfd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(mfd)
		return -1, fmt.Errorf("mount_setattr nosuid,nodev,private: %w", err)
	}
	if o.ReadOnly || o.RecursiveReadOnly {
		flags := uint(unix.AT_EMPTY_PATH)
		if o.RecursiveReadOnly {
			flags |= unix.AT_RECURSIVE
		}
		// mount -o remount,bind,ro (top mount, or every mount for rro)
		ro := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(mfd, "", flags, &ro); err != nil {
			unix.Close(mfd)
			return -1, fmt.Errorf("mount_setattr ro: %w", err)
		}
	}
	return mfd, nil
}

// Attach moves the detached mount mfd onto the mount point targetfd (an
// O_PATH descriptor opened with OpenAt): no path is resolved.
func Attach(mfd, targetfd int) error {
	// mount --move <detached> TARGET (move_mount(2), descriptors both sides)
	if err := unix.MoveMount(mfd, "", targetfd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// SetPropagation sets the propagation of the mount whose root fd is (not
// recursively): unix.MS_SHARED, MS_SLAVE or MS_PRIVATE.
func SetPropagation(fd int, propagation uint64) error {
	// mount --make-{shared,slave,private} MOUNT
	attr := unix.MountAttr{Propagation: propagation}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr propagation %#x: %w", propagation, err)
	}
	return nil
}

// SetReadOnly makes the mount whose root fd is read-only (only that
// mount, not those below it).
func SetReadOnly(fd int) error {
	// mount -o remount,bind,ro MOUNT
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr ro: %w", err)
	}
	return nil
}

// UnmountFD lazily unmounts the mount whose root fd is (and so everything
// mounted below it): umount2 through /proc/self/fd/N reaches the mount
// the descriptor pins, whatever path leads there now.
func UnmountFD(fd int) error {
	// umount -l /proc/self/fd/N
	if err := unix.Unmount("/proc/self/fd/"+strconv.Itoa(fd), unix.MNT_DETACH); err != nil {
		return fmt.Errorf("umount2: %w", err)
	}
	return nil
}

// Find looks for the mount id names in this process's mount namespace
// and returns an O_PATH descriptor of its root, checked to be that mount
// (by its unique id) after opening, and the mount point as mountinfo
// showed it. found is false when the mount is gone.
func Find(id Identity) (fd int, mountPoint string, found bool, err error) {
	mp, ok, err := mountPointOf(id.OldID)
	if err != nil || !ok {
		return -1, "", false, err
	}
	// The mount point's path is the kernel's (no symlinks in it); refuse
	// any that appeared since, and check what was opened.
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err = unix.Openat2(unix.AT_FDCWD, mp, &how)
	if err != nil {
		return -1, mp, false, fmt.Errorf("opening mount point %s of mount %d: %w", mp, id.ID, err)
	}
	got, root, err := MountIdentity(fd)
	if err != nil || !id.Same(got) || !root {
		unix.Close(fd)
		if err == nil {
			// Another mount now has the old id, or this one is covered:
			// mount id id.ID is not reachable at its mount point.
			return -1, mp, false, nil
		}
		return -1, mp, false, fmt.Errorf("checking mount point %s: %w", mp, err)
	}
	return fd, mp, true, nil
}

// mountPointOf returns the mount point of the mount with (mountinfo) id.
func mountPointOf(id uint64) (string, bool, error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return "", false, err
	}
	for _, m := range ms {
		if m.ID == id {
			return m.MountPoint, true, nil
		}
	}
	return "", false, nil
}
