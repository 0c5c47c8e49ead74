package qemu

import (
	"fmt"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/fsguard"
)

// Each QEMU is forked by a thread of its own, which internal/fsguard
// confines first (QEMU inherits the confinement from its first
// instruction; no other thread of the process has it), and which lives
// as long as that QEMU:
//
//   - the confinement cannot be undone, and each QEMU's differs (its own
//     Landlock domain, its own files), so a thread serves one QEMU;
//   - Pdeathsig is delivered when the *thread* that forked the child
//     exits, not the process. The thread waits until QEMU has been reaped
//     (done), so QEMU is not killed while it runs, and if the process
//     dies (even by SIGKILL) the kernel delivers SIGKILL to QEMU.
//
// A thread that could not confine itself starts nothing.

// spawn starts cmd from a new thread confined to p, which ends once done
// is closed. It returns the Landlock ABI the thread used (0: none).
func spawn(cmd *exec.Cmd, p fsguard.Policy, done <-chan struct{}) (int, error) {
	type result struct {
		abi int
		err error
	}
	res := make(chan result, 1)
	offMainThread(func() {
		abi, err := fsguard.Confine(p)
		if err != nil {
			res <- result{err: fmt.Errorf("confining qemu (internal/fsguard): %w", err)}
			return
		}
		if err := cmd.Start(); err != nil {
			res <- result{err: err}
			return
		}
		res <- result{abi: abi}
		<-done
	})
	r := <-res
	return r.abi, r.err
}

// offMainThread runs f in a new goroutine locked to a thread that is not
// the process's main thread, and never unlocked: the thread ends with f.
// The main thread is the one a signal to the process's pid, or its
// /proc/<pid>, reaches: confined, it would share QEMU's Landlock domain
// and let QEMU signal the process. (Go also never ends the main
// thread, so a confined one would stay.)
func offMainThread(f func()) {
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
