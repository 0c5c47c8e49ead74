package fsguard

import (
	"errors"
	"fmt"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
)

// Kept are the capabilities a process the thread starts as root keeps:
// what QEMU's 9p server needs to act for guest root on its share (give
// files their guest owner, pass permission checks, set modes and times
// on files it does not own, keep a setgid directory's bit).
// CAP_DAC_READ_SEARCH is not among them: CAP_DAC_OVERRIDE covers reading
// and searching, and without it open_by_handle_at, which opens any file
// of a file system past every root, is refused by the kernel too.
var Kept = []uintptr{
	unix.CAP_CHOWN,
	unix.CAP_DAC_OVERRIDE,
	unix.CAP_FOWNER,
	unix.CAP_FSETID,
}

// KeptMask is Kept as /proc/PID/status prints a capability set.
func KeptMask() uint64 {
	var m uint64
	for _, c := range Kept {
		m |= 1 << c
	}
	return m
}

// dropBounding removes every other capability from the calling thread's
// bounding set. The thread keeps its own capabilities; a program it
// executes as root gets the bounding set as its permitted and effective
// sets, so QEMU runs without CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_SYS_MODULE
// and the rest, and (its permitted set being a strict subset of the
// shim's or containerd's) cannot read or write their memory through
// /proc either.
func dropBounding() error {
	keep := KeptMask()
	for c := uintptr(0); c < 64; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			return nil // past the kernel's last capability
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}

// AsUser makes the process started with attr run as uid and gid id, no
// supplementary groups, with Kept as its capabilities (ambient, so they
// survive the exec of an ordinary binary by a non-root user). A process
// that is not root cannot signal root's processes, nor another user's,
// where Landlock does not scope signals (before ABI 6: Debian 12's
// kernel has ABI 2), nor read their /proc files. The capabilities are
// effective only from the exec on: what the child reaches before (its
// working directory, the program's path) must be open to id.
func AsUser(attr *syscall.SysProcAttr, id uint32) {
	attr.Credential = &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}
	attr.AmbientCaps = slices.Clone(Kept)
}
