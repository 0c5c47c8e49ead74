package shim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/fifo"
	"github.com/containerd/log"

	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/sandbox"
)

// drainTimeout bounds the wait for output still in flight after an exit.
const drainTimeout = 5 * time.Second

// exitVMLost is the status of processes whose VM went away: 128+SIGKILL,
// as for a process killed by the OOM killer or a host reboot.
const exitVMLost = 128 + uint32(syscall.SIGKILL)

// stdio are the FIFO paths containerd passes for a process.
type stdio struct {
	stdin, stdout, stderr string
	terminal              bool
}

// proc is one process of a task: its init ("" exec id) or an exec.
type proc struct {
	containerID, execID string
	io                  stdio
	// spec is the OCI process (JSON) of an exec, sent at Start.
	spec []byte

	// startMu is held by Start across starting the process and queueing
	// TaskStart, and by the exit watcher before it queues TaskExit, so a
	// task's TaskStart always precedes its TaskExit.
	startMu sync.Mutex

	// mu guards the fields below.
	mu          sync.Mutex
	pid         uint32
	started     bool
	startFailed bool
	paused      bool
	exitStatus  uint32
	exitedAt    time.Time
	watching    bool

	exited   chan struct{} // closed once the exit status is known
	exitOnce sync.Once

	pumps    sync.WaitGroup
	ioCancel context.CancelFunc
	stdinMu  sync.Mutex
	stdinF   io.Closer // guarded by stdinMu
}

func newProc(containerID, execID string, sio stdio) *proc {
	return &proc{containerID: containerID, execID: execID, io: sio, exited: make(chan struct{}), ioCancel: func() {}}
}

// setExited records the exit; the first call wins.
func (p *proc) setExited(status uint32, at time.Time) bool {
	first := false
	p.exitOnce.Do(func() {
		p.mu.Lock()
		p.exitStatus, p.exitedAt = status, at
		p.mu.Unlock()
		close(p.exited)
		first = true
	})
	return first
}

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// status returns the exit status and time (zero before the exit).
func (p *proc) status() (uint32, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitStatus, p.exitedAt
}

// startIO opens the FIFOs and copies the streams to and from the agent
// until the process's streams end or closeIO is called. Output pumps
// start before the process runs, so nothing is missed.
func (p *proc) startIO(ctx context.Context, c sandbox.Agent) {
	ioCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.ioCancel = cancel
	out := func(path string, s agentclient.Stream) {
		defer p.pumps.Done()
		err := pumpOut(ioCtx, path, func(w io.Writer) error {
			return c.CopyOut(ioCtx, p.containerID, p.execID, s, w)
		})
		if err != nil && ioCtx.Err() == nil {
			log.G(ctx).WithError(err).WithField("stream", s.String()).Debug("copying output")
		}
	}
	if p.io.stdout != "" {
		p.pumps.Add(1)
		go out(p.io.stdout, agentclient.Stdout)
	}
	if p.io.stderr != "" && !p.io.terminal {
		p.pumps.Add(1)
		go out(p.io.stderr, agentclient.Stderr)
	}
	if p.io.stdin != "" {
		go func() {
			r, err := fifo.OpenFifo(ioCtx, p.io.stdin, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				log.G(ctx).WithError(err).Warn("opening stdin fifo")
				return
			}
			p.stdinMu.Lock()
			p.stdinF = r
			p.stdinMu.Unlock()
			if err := c.CopyIn(ioCtx, p.containerID, p.execID, r); err != nil && ioCtx.Err() == nil && !errors.Is(err, os.ErrClosed) {
				log.G(ctx).WithError(err).Debug("copying stdin")
			}
		}()
	}
}

// pumpOut opens the output FIFO at path and runs copy into it. As
// containerd's runc shim does, it first waits (until ctx ends) for
// containerd's reader: containerd opens its end in a goroutine of its own,
// which may come after the process has written everything and exited, and
// a writer that had come and gone by then would leave that open waiting
// for good (and containerd's ExecSync with it), the output lost. Then it
// opens a reader of its own, never read from, so that the FIFO always has
// one: while containerd restarts, its reader is gone, and the copy's
// writes wait in the FIFO for the next containerd instead of failing
// (EPIPE) and ending the copy.
func pumpOut(ctx context.Context, path string, copy func(io.Writer) error) error {
	w, err := fifo.OpenFifo(ctx, path, syscall.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("waiting for the reader of output fifo %s: %w", path, err)
	}
	defer w.Close()
	keep, err := readEnd(w)
	if err != nil {
		return fmt.Errorf("opening a read end of output fifo %s: %w", path, err)
	}
	defer keep.Close()
	return copy(w)
}

// readEnd opens a read end of the FIFO that w writes to, through w's
// descriptor (/proc/self/fd/N), so it is that FIFO and not whatever the
// path names by now. Non-blocking, it opens at once.
func readEnd(w io.Writer) (*os.File, error) {
	sc, ok := w.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%T has no descriptor", w)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var f *os.File
	cerr := raw.Control(func(fd uintptr) {
		f, err = os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(fd)), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	})
	return f, errors.Join(cerr, err)
}

// drain waits, bounded, for the output pumps after the exit.
func (p *proc) drain() {
	done := make(chan struct{})
	go func() { p.pumps.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drainTimeout):
	}
}

// closeStdin closes the stdin FIFO (CloseIO).
func (p *proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinF != nil {
		p.stdinF.Close()
		p.stdinF = nil
	}
}

// closeIO stops every pump (Delete).
func (p *proc) closeIO() {
	p.ioCancel()
	p.closeStdin()
}
