// Package reaper collects the exit statuses of the agent's children. There is
// one reaper per process: it waits for any child (wait4(-1)) on SIGCHLD and
// hands each status to whoever registered that pid. Statuses of pids nobody
// registered yet are kept until claimed, so a child that exits before its
// starter registered it is not lost.
//
// Because it reaps every child, nothing else in the process may wait for
// children (no exec.Cmd.Wait).
package reaper

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Exit is how a process ended.
type Exit struct {
	Pid int
	// Status is the exit code, or 128+N when killed by signal N.
	Status int32
	// Signal is the signal that killed the process, 0 if it exited.
	Signal uint32
	At     time.Time
}

// FromWaitStatus converts a wait status to an Exit.
func FromWaitStatus(pid int, ws unix.WaitStatus, at time.Time) Exit {
	e := Exit{Pid: pid, At: at}
	switch {
	case ws.Signaled():
		e.Signal = uint32(ws.Signal())
		e.Status = 128 + int32(ws.Signal())
	default:
		e.Status = int32(ws.ExitStatus())
	}
	return e
}

// maxPending bounds the statuses kept for pids nobody registered (orphans
// reparented to PID 1 that are never claimed); the oldest are dropped first.
const maxPending = 4096

// Reaper dispatches exit statuses of children to their waiters.
type Reaper struct {
	// wait4 reaps one child without blocking; pid 0 means none is ready.
	wait4 func() (pid int, ws unix.WaitStatus, err error)

	// mu guards waiters, pending and order. It is also held while a child is
	// started through Start, so no status of the new pid can be dispatched
	// before its waiter is registered.
	mu      sync.Mutex
	waiters map[int]chan Exit
	pending map[int]Exit
	order   []int // pending pids, oldest first
}

// New returns a reaper that reaps real children with wait4.
func New() *Reaper {
	return newReaper(func() (int, unix.WaitStatus, error) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		return pid, ws, err
	})
}

func newReaper(wait4 func() (int, unix.WaitStatus, error)) *Reaper {
	return &Reaper{wait4: wait4, waiters: map[int]chan Exit{}, pending: map[int]Exit{}}
}

// Run reaps children on every SIGCHLD until ctx is done. It reaps once at
// start, for children that exited before Run was called.
func (r *Reaper) Run(ctx context.Context) {
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	// A periodic sweep is a safety net only; SIGCHLD drives reaping.
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		r.Reap()
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
	}
}

// Reap collects every child that has exited and dispatches its status.
func (r *Reaper) Reap() {
	for {
		pid, ws, err := r.wait4()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if !ws.Exited() && !ws.Signaled() {
			continue
		}
		r.dispatch(FromWaitStatus(pid, ws, time.Now()))
	}
}

func (r *Reaper) dispatch(e Exit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.waiters[e.Pid]; ok {
		delete(r.waiters, e.Pid)
		ch <- e
		return
	}
	if _, ok := r.pending[e.Pid]; !ok {
		r.order = append(r.order, e.Pid)
	}
	r.pending[e.Pid] = e
	for len(r.order) > maxPending {
		delete(r.pending, r.order[0])
		r.order = r.order[1:]
	}
}

// Register returns a channel that receives pid's exit status once. If the
// status already arrived, the channel has it at once.
func (r *Reaper) Register(pid int) <-chan Exit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registerLocked(pid)
}

func (r *Reaper) registerLocked(pid int) <-chan Exit {
	ch := make(chan Exit, 1)
	if e, ok := r.pending[pid]; ok {
		delete(r.pending, pid)
		r.dropOrder(pid)
		ch <- e
		return ch
	}
	r.waiters[pid] = ch
	return ch
}

func (r *Reaper) dropOrder(pid int) {
	for i, p := range r.order {
		if p == pid {
			r.order = append(r.order[:i], r.order[i+1:]...)
			return
		}
	}
}

// Start runs start, which must create one child and return its pid, and
// registers that pid before any status can be dispatched for it. A pending
// status for the same pid is stale (a reused pid) and is discarded.
func (r *Reaper) Start(start func() (int, error)) (int, <-chan Exit, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	if _, ok := r.pending[pid]; ok {
		delete(r.pending, pid)
		r.dropOrder(pid)
	}
	return pid, r.registerLocked(pid), nil
}

// SetSubreaper makes this process the reaper of its orphaned descendants, so
// that off PID 1 (in tests on a host) the reaper still sees them.
func SetSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}
