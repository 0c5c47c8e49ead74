package container

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/reaper"
	"github.com/hull-runtime/hull/internal/guest/stdio"
)

// Process is a container's init or exec process as the agent tracks it.
type Process struct {
	ID       string // exec id, "" for init
	Pid      int
	Terminal bool

	Stdout, Stderr *stdio.Stream

	// stdinMu guards stdin.
	stdinMu sync.Mutex
	stdin   io.WriteCloser // nil when not requested or closed
	pty     *os.File       // the master, for tty processes

	done chan struct{} // closed once exit is set
	exit reaper.Exit
}

// procIO is what a new process gets for fds 0, 1, 2 and what the agent keeps.
type procIO struct {
	child   [3]*os.File // closed in the agent after the fork
	stdin   io.WriteCloser
	pty     *os.File
	outR    io.ReadCloser
	errR    io.ReadCloser
	hasCtty bool
}

func (p *procIO) closeChild() {
	for _, f := range p.child {
		if f != nil {
			f.Close()
		}
	}
}

// closeAll releases everything (on a failed start).
func (p *procIO) closeAll() {
	p.closeChild()
	for _, c := range []io.Closer{p.stdin, p.pty, p.outR, p.errR} {
		if c != nil {
			c.Close()
		}
	}
}

type noClose struct{ io.Reader }

func (noClose) Close() error { return nil }

func newProcIO(terminal, stdin bool, ptmx string) (*procIO, error) {
	io := &procIO{}
	if terminal {
		m, s, err := stdio.OpenPTY(ptmx)
		if err != nil {
			return nil, err
		}
		io.pty = m
		// The slave serves as fds 0, 1 and 2 (see fds); hold it once.
		io.child = [3]*os.File{s, nil, nil}
		io.outR = noClose{m}
		if stdin {
			io.stdin = m
		}
		io.hasCtty = true
		return io, nil
	}
	fail := func(err error) (*procIO, error) {
		io.closeAll()
		return nil, err
	}
	if stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("creating stdin pipe: %w", err))
		}
		io.child[0], io.stdin = r, w
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return fail(fmt.Errorf("opening %s: %w", os.DevNull, err))
		}
		io.child[0] = null
	}
	r, w, err := os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("creating stdout pipe: %w", err))
	}
	io.child[1], io.outR = w, r
	r, w, err = os.Pipe()
	if err != nil {
		return fail(fmt.Errorf("creating stderr pipe: %w", err))
	}
	io.child[2], io.errR = w, r
	return io, nil
}

// fds returns the child's fds 0, 1, 2.
func (p *procIO) fds() []uintptr {
	if p.hasCtty {
		fd := p.child[0].Fd()
		return []uintptr{fd, fd, fd}
	}
	return []uintptr{p.child[0].Fd(), p.child[1].Fd(), p.child[2].Fd()}
}

// newProcess wraps a started process; onExit (if not nil) runs when it has
// exited, before anyone waiting for it learns that.
func newProcess(id string, pid int, terminal bool, pio *procIO, exits <-chan reaper.Exit, onExit func()) *Process {
	p := &Process{ID: id, Pid: pid, Terminal: terminal, stdin: pio.stdin, pty: pio.pty, done: make(chan struct{})}
	p.Stdout = stdio.NewStream(pio.outR)
	if terminal {
		p.Stderr = stdio.Closed()
	} else {
		p.Stderr = stdio.NewStream(pio.errR)
	}
	go func() {
		p.exit = <-exits
		if onExit != nil {
			onExit()
		}
		close(p.done)
	}()
	return p
}

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the process exited or ctx ends.
func (p *Process) Wait(ctx context.Context) (reaper.Exit, error) {
	select {
	case <-p.done:
		return p.exit, nil
	case <-ctx.Done():
		return reaper.Exit{}, ctx.Err()
	}
}

// WriteStdin writes all of data to the process's stdin.
func (p *Process) WriteStdin(data []byte) (int, error) {
	p.stdinMu.Lock()
	w := p.stdin
	p.stdinMu.Unlock()
	if w == nil {
		return 0, fmt.Errorf("stdin of process %q is not open: %w", p.ID, errdefs.ErrFailedPrecondition)
	}
	n, err := w.Write(data)
	if err != nil {
		return n, fmt.Errorf("writing stdin: %w", err)
	}
	return n, nil
}

// eot is the terminal's end-of-file character (^D), which a tty process
// reads as EOF at the start of a line.
const eot = 0x04

// CloseStdin closes stdin: for pipes the write end is closed; for a tty ^D
// is written (the terminal stays open for output). Closing twice is a no-op.
func (p *Process) CloseStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return nil
	}
	w := p.stdin
	p.stdin = nil
	if p.Terminal {
		_, err := w.Write([]byte{eot})
		return err
	}
	return w.Close()
}

// Resize sets the tty's window size.
func (p *Process) Resize(width, height uint32) error {
	if p.pty == nil {
		return fmt.Errorf("process %q has no terminal: %w", p.ID, errdefs.ErrFailedPrecondition)
	}
	return stdio.Resize(p.pty, uint16(width), uint16(height))
}

// release closes what the agent holds for the process.
func (p *Process) release() {
	p.CloseStdin()
	p.Stdout.Close()
	p.Stderr.Close()
	if p.pty != nil {
		p.pty.Close()
	}
}
