package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

// QEMU's root once started is ChrootDir, empty but for proc/self/fd:
// QEMU's 9p server reaches files by descriptor, but changes modes and
// extended attributes through /proc/self/fd/N paths (no
// AT_SYMLINK_NOFOLLOW for fchmodat, no *xattrat calls in QEMU 7.2).
// That one directory is a bind mount of /proc/<qemu pid>/fd: QEMU sees
// its own descriptors there and nothing else of /proc.

// ProcFDMount is the bind mount of QEMU's /proc/<pid>/fd inside its
// root. Start mounts it and unmounts it once QEMU has exited; a caller
// that records resources records it as a mount.
func (q *QEMU) ProcFDMount() string { return filepath.Join(q.ChrootDir(), "proc", "self", "fd") }

// prepareChroot creates ChrootDir and the mount point in it; only root
// may enter them.
func (q *QEMU) prepareChroot() error {
	for _, d := range []string{q.ChrootDir(), filepath.Join(q.ChrootDir(), "proc"), filepath.Join(q.ChrootDir(), "proc", "self"), q.ProcFDMount()} {
		if err := os.Mkdir(d, 0o500); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating qemu's root directory: %w", err)
		}
	}
	return nil
}

// mountProcFD binds /proc/<pid>/fd onto ProcFDMount:
// mount --bind -o nosuid,nodev,noexec /proc/PID/fd ROOT/proc/self/fd.
func (q *QEMU) mountProcFD(pid int) error {
	src := "/proc/" + strconv.Itoa(pid) + "/fd"
	if err := unix.Mount(src, q.ProcFDMount(), "", unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", src, q.ProcFDMount(), err)
	}
	return nil
}

// unmountProcFD detaches the bind mount: umount -l ROOT/proc/self/fd.
func (q *QEMU) unmountProcFD() {
	err := unix.Unmount(q.ProcFDMount(), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
	if err != nil && err != unix.EINVAL && err != unix.ENOENT {
		q.log.Warn("unmounting qemu's descriptor directory", "path", q.ProcFDMount(), "error", err)
	}
}

// KindProcFDMount is the state record of ProcFDMount (Key: its path).
// Once QEMU is gone its mount point fails stat with ENOENT, so it is
// released by unmounting it without looking at it first, which the
// generic mount releaser would not do.
const KindProcFDMount state.Kind = "qemu-procfd"

// Releasers are this package's state releasers (internal/releasers
// gathers them with the others).
func Releasers() state.Releasers {
	return state.Releasers{KindProcFDMount: releaseProcFDMount}
}

// ProcFDMountResource is the record of ProcFDMount.
func (q *QEMU) ProcFDMountResource() state.Resource {
	return state.Resource{Kind: KindProcFDMount, Key: q.ProcFDMount()}
}

// releaseProcFDMount unmounts a recorded ProcFDMount: umount -l PATH (as
// many times as something is mounted there). Only a path that is a
// ProcFDMount (…/qemu-root/proc/self/fd) is acted on.
func releaseProcFDMount(_ context.Context, r state.Resource) error {
	p := r.Key
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || !strings.HasSuffix(p, "/"+filepath.Join(chrootName, "proc", "self", "fd")) {
		return fmt.Errorf("releasing %s: not a qemu-root/proc/self/fd path", p)
	}
	for range 8 {
		err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		switch {
		case err == unix.EINVAL || err == unix.ENOENT:
			return nil // not (or no longer) a mount point
		case err != nil:
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
	return fmt.Errorf("%s is still mounted after 8 unmounts", p)
}
