// Package hostfs does the host's filesystem work on a sandbox's tree
// through descriptors, so that nothing a guest could have planted there —
// a symlink, a renamed directory, a file where a directory was — is ever
// followed: every path below a trusted anchor directory is resolved with
// openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS),
// directories are created and removed with mkdirat/unlinkat relative to a
// directory descriptor, and mounts are named by their unique mount id
// (statx STATX_MNT_ID_UNIQUE), which no rename changes and no later mount
// reuses. The anchor itself (a sandbox's directory, or the private tree
// below it) is the host's and is opened normally.
package hostfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// resolveBeneath refuses every symlink, /proc magic link and escape from
// the directory resolution starts at.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// OpenAnchor opens a trusted directory (a path the host made, not below
// anything a guest can write) as an O_PATH descriptor.
func OpenAnchor(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "opening", Path: dir, Err: err}
	}
	return fd, nil
}

// OpenAt opens rel below the directory dirfd without following any
// symlink or leaving that directory; noXdev also refuses to cross a mount
// point (EXDEV). flags are open(2) flags; O_NOFOLLOW and O_CLOEXEC are
// added.
func OpenAt(dirfd int, rel string, flags int, noXdev bool) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC), Resolve: resolveBeneath}
	if noXdev {
		how.Resolve |= unix.RESOLVE_NO_XDEV
	}
	for {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // EAGAIN: a concurrent rename anywhere; retry
		}
		return fd, err
	}
}

// Open opens rel below the trusted directory anchor (see OpenAt).
func Open(anchor, rel string, flags int, noXdev bool) (int, error) {
	afd, err := OpenAnchor(anchor)
	if err != nil {
		return -1, err
	}
	defer unix.Close(afd)
	fd, err := OpenAt(afd, rel, flags, noXdev)
	if err != nil {
		return -1, &os.PathError{Op: "opening", Path: filepath.Join(anchor, rel), Err: err}
	}
	return fd, nil
}

// Rel returns path relative to anchor, refusing a path that is not below
// it (or is anchor itself).
func Rel(anchor, path string) (string, error) {
	rel, err := filepath.Rel(anchor, path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%s is not below %s", path, anchor)
	}
	return rel, nil
}

// MkdirAll creates rel and its missing parents below the trusted
// directory anchor, component by component with mkdirat, and returns an
// O_PATH descriptor of the last one. A component that exists as anything
// but a directory of the same mount (a symlink, a file, a mount point) is
// an error naming it.
func MkdirAll(anchor, rel string, mode uint32) (int, error) {
	fd, err := OpenAnchor(anchor)
	if err != nil {
		return -1, err
	}
	done := anchor
	for _, c := range strings.Split(filepath.Clean(rel), "/") {
		if c == "" || c == "." || c == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("creating %s below %s: invalid component %q", rel, anchor, c)
		}
		done = filepath.Join(done, c)
		// mkdir DIR (relative to the parent's descriptor)
		if err := unix.Mkdirat(fd, c, mode); err != nil && err != unix.EEXIST {
			unix.Close(fd)
			return -1, fmt.Errorf("creating %s: %w", done, err)
		}
		next, err := OpenAt(fd, c, unix.O_PATH|unix.O_DIRECTORY, true)
		if err == unix.ENOTDIR {
			// O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR: say which.
			var st unix.Stat_t
			if unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = unix.ELOOP
			}
		}
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("opening %s: %w", done, describe(err))
		}
		fd = next
	}
	return fd, nil
}

// describe turns openat2's refusals into what they mean here.
func describe(err error) error {
	switch err {
	case unix.ELOOP:
		return fmt.Errorf("a symlink is in the way: %w", err)
	case unix.ENOTDIR:
		return fmt.Errorf("not a directory: %w", err)
	case unix.EXDEV:
		return fmt.Errorf("a mount point is in the way: %w", err)
	}
	return err
}

// ErrMounted is returned (wrapped) by RemoveAll when a mount lies in the
// way: nothing is ever removed through a mount.
var ErrMounted = errors.New("a mount is in the way")

// maxDepth bounds RemoveAll's recursion (a planted tree could be deep):
// a directory deeper than that is moved up to the top of the walk and
// removed from there, so that no depth makes the removal fail.
const maxDepth = 128

// RemoveAll removes rel below the trusted directory anchor and everything
// in it, walking by descriptor: symlinks are unlinked, never followed,
// and a mount point anywhere (a directory on another mount, or a file
// that is a bind target) stops the walk with an error matching ErrMounted
// and naming it. Whatever rel now is (a file, a symlink) is removed; a
// missing rel is not an error.
func RemoveAll(anchor, rel string) error {
	parent, name := filepath.Split(filepath.Clean(rel))
	var pfd int
	var err error
	if parent == "" {
		pfd, err = OpenAnchor(anchor)
	} else {
		pfd, err = Open(anchor, parent, unix.O_PATH|unix.O_DIRECTORY, true)
	}
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing %s: %w", filepath.Join(anchor, rel), describe(unwrapErrno(err)))
	}
	defer unix.Close(pfd)
	w := &walker{}
	return w.removeAt(pfd, name, filepath.Join(anchor, rel), 0)
}

// walker is one RemoveAll: the top directory's descriptor, and the names
// of the too-deep directories moved into it, still to remove.
type walker struct {
	top   int
	moved []string
	n     int
}

// removeAt removes name in the directory dirfd (shown as path in errors).
func (w *walker) removeAt(dirfd int, name, path string, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return fmt.Errorf("removing %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unlinkAt(dirfd, name, path, 0)
	}
	fd, err := OpenAt(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, true)
	switch {
	case err == unix.ENOENT:
		return nil
	case err == unix.ELOOP || err == unix.ENOTDIR:
		// Replaced meanwhile by a symlink or a file: unlink that.
		return unlinkAt(dirfd, name, path, 0)
	case err == unix.EXDEV:
		return fmt.Errorf("refusing to remove %s: %w (it is a mount point)", path, ErrMounted)
	case err != nil:
		return fmt.Errorf("removing %s: %w", path, err)
	}
	dir := os.NewFile(uintptr(fd), path)
	defer dir.Close()
	if depth == 0 {
		w.top = fd
	} else if depth > maxDepth {
		// mv NAME TOP/.deep-N (both relative to descriptors)
		w.n++
		moved := fmt.Sprintf(".hull-deep-%d", w.n)
		if err := unix.Renameat(dirfd, name, w.top, moved); err != nil {
			return fmt.Errorf("removing %s: moving it up: %w", path, err)
		}
		w.moved = append(w.moved, moved)
		return nil
	}
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	var errs []error
	for _, n := range names {
		if err := w.removeAt(fd, n, filepath.Join(path, n), depth+1); err != nil {
			errs = append(errs, err)
		}
	}
	for depth == 0 && len(w.moved) > 0 {
		n := w.moved[len(w.moved)-1]
		w.moved = w.moved[:len(w.moved)-1]
		if err := w.removeAt(fd, n, filepath.Join(path, n), 1); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return unlinkAt(dirfd, name, path, unix.AT_REMOVEDIR)
}

func unlinkAt(dirfd int, name, path string, flags int) error {
	// rm NAME / rmdir NAME (relative to the parent's descriptor)
	err := unix.Unlinkat(dirfd, name, flags)
	switch {
	case err == nil || err == unix.ENOENT:
		return nil
	case err == unix.EBUSY:
		return fmt.Errorf("refusing to remove %s: %w (it is a mount point)", path, ErrMounted)
	default:
		return fmt.Errorf("removing %s: %w", path, err)
	}
}

func unwrapErrno(err error) error {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return err
}
