package nsinit

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// inRoot resolves paths as if the rootfs were "/": "..", and absolute
// and relative symlinks, never leave it; magic links (/proc/self/root)
// are refused.
var inRoot = &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// openAt opens rel in the rootfs rootFD as an O_PATH descriptor.
func openAt(rootFD int, rel string) (int, error) {
	// openat2(ROOTFD, REL, {O_PATH, RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS})
	return unix.Openat2(rootFD, rel, inRoot)
}

// lastElement opens name in the directory dirFD without following it:
// a symlink there fails with ELOOP.
var lastElement = &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}

// openTarget opens the mount target dest in the rootfs, creating what
// is missing of it: directories, and a file as the last element when
// !dir (the target of a file bind). Every element is created in its
// parent as resolved inside the rootfs.
//
// The rootfs is the pod's 9p share, where every lookup of a name is a
// round trip to QEMU (cache=mmap keeps no dentries): the common cases,
// an existing target and a missing last element in an existing
// directory, are resolved through the parent, opened once; anything
// else (a symlink as the last element, missing directories, a race)
// takes the element-by-element walk.
func openTarget(rootFD int, dest string, dir bool) (int, error) {
	rel := strings.TrimPrefix(filepath.Clean("/"+dest), "/")
	if rel == "" {
		rel = "."
	}
	if fd, ok, err := openTargetInParent(rootFD, rel, dir); ok || err != nil {
		return fd, err
	}
	return walkTarget(rootFD, dest, rel, dir)
}

// openTargetInParent opens or creates rel's last element in its parent
// directory, resolved inside the rootfs. ok is false when the walk must
// decide: the parent is missing, the last element is a symlink (resolved
// inside the rootfs by the walk), or it appeared while being created.
func openTargetInParent(rootFD int, rel string, dir bool) (fd int, ok bool, err error) {
	parent, err := openAt(rootFD, filepath.Dir(rel))
	if err != nil {
		return -1, false, nil
	}
	defer unix.Close(parent)
	name := filepath.Base(rel)
	// openat2(PARENT, NAME, {O_PATH, RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS})
	fd, err = unix.Openat2(parent, name, lastElement)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err == nil, nil
	}
	if dir {
		// mkdir PARENT/NAME
		err = unix.Mkdirat(parent, name, 0o755)
		if err == nil {
			fd, err = unix.Openat2(parent, name, lastElement)
		}
	} else {
		// The created file's descriptor is the mount point: no lookup
		// again. O_EXCL|O_NOFOLLOW: never a file someone else put there.
		fd, err = unix.Openat(parent, name, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ELOOP) {
			return -1, false, nil
		}
		return -1, false, fmt.Errorf("creating mount point %s: %w", "/"+rel, err)
	}
	return fd, true, nil
}

// walkTarget is openTarget element by element: rel is resolved inside the
// rootfs (a dangling symlink names what is created), and each missing
// element is made in its parent as resolved inside the rootfs.
func walkTarget(rootFD int, dest, rel string, dir bool) (int, error) {
	fd, err := openAt(rootFD, rel)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		if err != nil {
			return -1, fmt.Errorf("resolving mount point %s in the rootfs: %w", dest, err)
		}
		return fd, nil
	}
	// Dangling symlinks name what is to be created: resolve them
	// lexically inside the rootfs first (the walk below still resolves
	// every element in the rootfs, should a link change meanwhile).
	joined, err := SecureJoin(fdPath(rootFD), rel)
	if err != nil {
		return -1, err
	}
	rel = strings.TrimPrefix(strings.TrimPrefix(joined, fdPath(rootFD)), "/")
	if rel == "" {
		rel = "."
	}
	parts := strings.Split(rel, "/")
	cur := "."
	for i, p := range parts {
		next := filepath.Join(cur, p)
		fd, err := openAt(rootFD, next)
		if err == nil {
			if i == len(parts)-1 {
				return fd, nil
			}
			unix.Close(fd)
			cur = next
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("resolving mount point %s in the rootfs: %w", dest, err)
		}
		parent, err := openAt(rootFD, cur)
		if err != nil {
			return -1, fmt.Errorf("resolving mount point %s in the rootfs: %w", dest, err)
		}
		if i < len(parts)-1 || dir {
			// mkdir ROOT/CUR/P (CUR as resolved in the rootfs)
			err = unix.Mkdirat(parent, p, 0o755)
		} else {
			var f int
			f, err = unix.Openat(parent, p, unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(f)
			}
		}
		unix.Close(parent)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("creating mount point %s: %w", dest, err)
		}
		if fd, err = openAt(rootFD, next); err != nil {
			return -1, fmt.Errorf("resolving mount point %s in the rootfs: %w", dest, err)
		}
		if i == len(parts)-1 {
			return fd, nil
		}
		unix.Close(fd)
		cur = next
	}
	return -1, fmt.Errorf("mount point %s: empty path", dest)
}

// remountAt applies flags (a remount or a propagation change) to what is
// now mounted at dest in the rootfs, opened again so that the descriptor
// names the new mount, not the directory under it.
func remountAt(rootFD int, dest string, flags uintptr) error {
	rel := strings.TrimPrefix(filepath.Clean("/"+dest), "/")
	if rel == "" {
		rel = "."
	}
	fd, err := openAt(rootFD, rel)
	if err != nil {
		return fmt.Errorf("resolving %s in the rootfs: %w", dest, err)
	}
	defer unix.Close(fd)
	return unix.Mount("", fdPath(fd), "", flags, "")
}
