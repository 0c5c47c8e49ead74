package qemu

import (
	"fmt"
	"os/exec"

	"github.com/hull-runtime/hull/internal/fsguard"
)

// Each QEMU is forked by a thread of its own (fsguard.OnOwnThread: never
// the process's main thread), which internal/fsguard confines first
// (QEMU inherits the confinement from its first instruction; no other
// thread of the process has it), and which lives as long as that QEMU:
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
	fsguard.OnOwnThread(func() {
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
