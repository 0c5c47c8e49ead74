// Package fsguard confines the processes Hull starts QEMU as. QEMU runs
// as root, parses everything the guest sends, and its 9p server does on
// the host whatever guest root asks of its share; Hull treats it as the
// next thing a hostile guest takes (docs/security.md, "QEMU
// confinement"). Confine, called on the thread that then forks QEMU,
// gives that thread (and so QEMU, from its first instruction) these
// limits no other thread of the caller has:
//
//   - a root of its own (root.go, Policy.Root): a mount namespace whose
//     root holds only the paths the Policy names, so no other host file
//     can be named at all, its owner and mode included, which Landlock
//     does not govern and the 9p server's capabilities would change;
//   - a capability bounding set of Kept alone, so QEMU runs with those
//     four capabilities and no others (caps.go);
//   - no_new_privs;
//   - a Landlock domain of its own (landlock.go), where the kernel has
//     Landlock: the host's files only as the Policy names them, however
//     QEMU names a file ("..", descriptors, /proc), no TCP, no signal or
//     ptrace into a process outside the domain, another pod's QEMU
//     included;
//   - a seccomp filter (seccomp.go) that refuses what the 9p server
//     must not do for the guest (device nodes, setuid and setgid modes,
//     xattrs, which carry file capabilities), io_uring (whose operations
//     it would not see), every syscall of another ABI (x32, i386), and
//     what a fallen QEMU would use against other processes or the host
//     and QEMU never calls: socket (QEMU's sockets are the host's,
//     passed), ptrace, process_vm_*, pidfd_getfd, files by handle,
//     mounts, namespaces, chroot, modules, kexec, bpf, perf, userfaultfd, keys,
//     the clock, reboot, swap, truncate by path. QEMU's own -sandbox
//     filter stacks on top of it;
//   - where the Policy names files to open read-only, a second filter
//     whose opens for writing the caller answers (reopen.go): a clone's
//     QEMU gets its template's memory for reading only.
//
// Go cannot run code in a child between fork and exec, so all of it is
// set on the thread that forks: a child inherits its parent thread's
// bounding set, no_new_privs, Landlock domain and filter.
package fsguard

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Confine applies the limits above to the calling thread, for good. The
// caller runs it in OnOwnThread: Go then runs nothing else on the thread
// and starts its own new threads from another one, so the limits stay
// with that thread and the processes it starts. The Confinement says
// which Landlock ABI it used, 0 where the kernel offers none that fits
// (then the rest applies alone), and answers the opens of
// p.ReadOnlyOpens (reopen.go) until the caller closes it, once the
// processes the thread started are gone. It refuses the process's main
// thread.
func Confine(p Policy) (*Confinement, error) {
	if unix.Gettid() == unix.Getpid() {
		return nil, fmt.Errorf("confining the process's main thread: use OnOwnThread")
	}
	if err := checkReadOnlyOpens(p); err != nil {
		return nil, err
	}
	if p.Root != "" {
		if err := enterRoot(p); err != nil {
			return nil, err
		}
	}
	if err := dropBounding(); err != nil {
		return nil, err
	}
	// prctl(PR_SET_NO_NEW_PRIVS, 1): required for Landlock and a filter without CAP_SYS_ADMIN
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("setting no_new_privs: %w", err)
	}
	abi, err := landlock(p)
	if err != nil {
		return nil, err
	}
	if err := installSeccomp(); err != nil {
		return nil, err
	}
	c := &Confinement{LandlockABI: abi}
	if len(p.ReadOnlyOpens) > 0 {
		if c.r, err = listen(p.ReadOnlyOpens); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// OnOwnThread runs f in a new goroutine locked to a thread of its own
// that is not the process's main thread, and never unlocked: the thread
// ends with f. The main thread is the one a signal to the process's pid,
// or its /proc/<pid>, reaches: confined, it would share its Landlock
// domain with the processes it starts and let them signal the process.
// (Go also never ends the main thread, so a confined one would stay.)
func OnOwnThread(f func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			f()
			return
		}
		// Keep the main thread locked, so that Go cannot run the new
		// goroutine on it, until that one holds a thread of its own.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			f()
		}()
		<-locked
		runtime.UnlockOSThread()
	}()
}
