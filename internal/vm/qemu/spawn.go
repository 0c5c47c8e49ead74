package qemu

import (
	"fmt"
	"os/exec"
	"runtime"
	"sync"

	"github.com/hull-runtime/hull/internal/fsguard"
)

// Pdeathsig is delivered when the *thread* that forked the child exits,
// not the process. Go runs os/exec on any thread and may retire threads,
// so a child started from an ordinary goroutine could be killed at a
// random moment, or (with the thread reused) not at all. Every QEMU is
// therefore forked by one goroutine locked to its thread for the life of
// the process: the thread exits only with the process, and then the
// kernel delivers SIGKILL to every QEMU, even if we were SIGKILLed.
//
// The same thread carries internal/fsguard's filter, which every QEMU
// inherits from its first instruction; no other thread of the process
// has it. A thread that could not install it starts nothing.

type spawnRequest struct {
	cmd *exec.Cmd
	res chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnRequest
)

func spawner() {
	runtime.LockOSThread() // never unlocked: the thread dies with the process
	guard := fsguard.InstallThread()
	if guard != nil {
		guard = fmt.Errorf("qemu's file system guard (internal/fsguard): %w", guard)
	}
	for req := range spawnCh {
		if guard != nil {
			req.res <- guard
			continue
		}
		req.res <- req.cmd.Start()
	}
}

// spawn starts cmd from the spawner thread.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnRequest)
		go spawner()
	})
	res := make(chan error, 1)
	spawnCh <- spawnRequest{cmd: cmd, res: res}
	return <-res
}
