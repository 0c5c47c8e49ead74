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

// openTarget opens the mount target dest in the rootfs, creating what
// is missing of it: directories, and a file as the last element when
// !dir (the target of a file bind). Every element is created in its
// parent as resolved inside the rootfs.
func openTarget(rootFD int, dest string, dir bool) (int, error) {
	rel := strings.TrimPrefix(filepath.Clean("/"+dest), "/")
	if rel == "" {
		rel = "."
	}
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
