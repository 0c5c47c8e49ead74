package qemu

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

// KindProcFDMount is the record of a bind mount that shims before
// 2026-12-05 made for a chrooted QEMU (/proc/<pid>/fd on
// <sandbox dir>/qemu-root/proc/self/fd). QEMU now has a root of its own
// and nothing is mounted on the host for it; the kind is still released,
// for the records of sandboxes such a shim left.
const KindProcFDMount state.Kind = "qemu-procfd"

// Releasers are this package's state releasers (internal/releasers
// gathers them with the others).
func Releasers() state.Releasers {
	return state.Releasers{KindProcFDMount: releaseProcFDMount}
}

// releaseProcFDMount unmounts a recorded mount: umount -l PATH (as many
// times as something is mounted there), without a stat first (once its
// QEMU was gone the mount point failed stat with ENOENT). Only a path
// that is such a mount (…/qemu-root/proc/self/fd) is acted on.
func releaseProcFDMount(_ context.Context, r state.Resource) error {
	p := r.Key
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || !strings.HasSuffix(p, "/"+filepath.Join(rootName, "proc", "self", "fd")) {
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
