package run

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
)

// terminal is the caller's terminal while the command has a tty: raw mode,
// and window size changes forwarded to the guest.
type terminal struct {
	fd      int
	saved   *unix.Termios
	winch   chan os.Signal
	lastErr error
}

// setupTerminal puts stdin into raw mode and sends the initial window size
// when -t was given and stdin is a terminal; otherwise it returns nil.
func (r *Runner) setupTerminal(ctx context.Context) (*terminal, error) {
	if !r.opts.TTY {
		return nil, nil
	}
	f, ok := r.stdio.In.(*os.File)
	if !ok {
		return nil, nil
	}
	fd := int(f.Fd())
	saved, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, nil // not a terminal: the guest keeps its default size
	}
	t := &terminal{fd: fd, saved: saved, winch: make(chan os.Signal, 1)}
	signal.Notify(t.winch, syscall.SIGWINCH)
	t.sendSize(ctx, r.client)
	if r.opts.Interactive {
		raw := *saved
		raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		raw.Oflag &^= unix.OPOST
		raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		raw.Cflag &^= unix.CSIZE | unix.PARENB
		raw.Cflag |= unix.CS8
		raw.Cc[unix.VMIN] = 1
		raw.Cc[unix.VTIME] = 0
		if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
			signal.Stop(t.winch)
			return nil, fmt.Errorf("setting the terminal to raw mode: %w", err)
		}
	}
	return t, nil
}

// resized is a channel of window-size changes; nil (never ready) without a tty.
func (t *terminal) resized() <-chan os.Signal {
	if t == nil {
		return nil
	}
	return t.winch
}

// sendSize tells the guest the terminal's current size.
func (t *terminal) sendSize(ctx context.Context, c *agentclient.Client) {
	if t == nil {
		return
	}
	ws, err := unix.IoctlGetWinsize(t.fd, unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 || ws.Row == 0 {
		return
	}
	_, t.lastErr = c.ResizeTTY(ctx, &agent.ResizeTTYRequest{ContainerId: containerID, Width: uint32(ws.Col), Height: uint32(ws.Row)})
}

// restore puts the terminal back as it was.
func (t *terminal) restore() error {
	signal.Stop(t.winch)
	if err := unix.IoctlSetTermios(t.fd, unix.TCSETS, t.saved); err != nil {
		return fmt.Errorf("restoring the terminal: %w", err)
	}
	return nil
}
