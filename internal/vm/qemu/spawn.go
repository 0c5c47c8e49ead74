package qemu

import (
	"fmt"
	"hash/fnv"
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
		c, err := fsguard.Confine(p)
		if err != nil {
			res <- result{err: fmt.Errorf("confining qemu (internal/fsguard): %w", err)}
			return
		}
		defer c.Close() // QEMU is reaped: nothing is left to answer
		if err := cmd.Start(); err != nil {
			res <- result{err: err}
			return
		}
		res <- result{abi: c.LandlockABI}
		<-done
	})
	r := <-res
	return r.abi, r.err
}

// QEMU runs as a user and group of its own, per VM (fsguard.AsUser):
// UIDBase plus a hash of the VM's id, below UIDBase+UIDSpan. No host
// account is expected in that range; a fallen QEMU cannot signal or
// read another VM's QEMU, nor root's processes, whatever the kernel's
// Landlock. Two VMs share a user only if their ids' hashes collide
// (for 100 VMs, about 3 in 10 000), which leaves each one's Landlock
// domain and root between them.
const (
	UIDBase = 0x7e000000
	UIDSpan = 1 << 24
)

// UID is the user and group id QEMU of VM id runs as.
func UID(id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return UIDBase + h.Sum32()%UIDSpan
}
