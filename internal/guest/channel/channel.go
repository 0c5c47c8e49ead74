// Package channel provides the agent's end of the host channel as a
// net.Listener: a virtio-serial port (a character device, wrapped as a
// one-connection-at-a-time listener) or a vsock socket.
//
// A virtio-serial port reads 0 bytes while no host is connected. A
// connection that has not read anything yet takes that as "not yet" and
// waits for the host: the virtio_console driver sends SIGIO when the host
// side opens (the port has O_ASYNC and the agent as its owner), with a
// poll once a second as the fallback. A guest restored from a template
// is already waiting on its port when the host connects, so it answers at
// once. A 0-byte read after data is EOF: the host went away, and the next
// host starts a new ttrpc session on a new connection. Only a connection
// that has not answered yet first gives the driver a moment to handle the
// host's connect, which can come after the host's data (fileConn.catchUp).
package channel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// PortName is the virtio-serial port name of the agent channel.
const PortName = "hull.agent"

// FindPort looks for the virtio-serial port called name under sysClass
// (normally /sys/class/virtio-ports) and returns its device path under
// devDir (normally /dev).
func FindPort(sysClass, devDir, name string) (string, error) {
	entries, err := os.ReadDir(sysClass)
	if err != nil {
		return "", fmt.Errorf("listing virtio ports: %w", err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(sysClass, e.Name(), "name"))
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(data)) == name {
			return filepath.Join(devDir, e.Name()), nil
		}
	}
	return "", fmt.Errorf("virtio port %q: %w", name, os.ErrNotExist)
}

// WaitPort polls for the port until it appears (and its device node exists)
// or ctx ends.
func WaitPort(ctx context.Context, sysClass, devDir, name string) (string, error) {
	for {
		p, err := FindPort(sysClass, devDir, name)
		if err == nil {
			if _, err = os.Stat(p); err == nil {
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for virtio port %q: %w (last: %v)", name, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Addr names a channel endpoint.
type Addr struct{ Net, Name string }

func (a Addr) Network() string { return a.Net }
func (a Addr) String() string  { return a.Name }

// fileConn is a net.Conn over a stream that is not a socket.
type fileConn struct {
	rwc  io.ReadWriteCloser
	addr Addr
	// wake receives when the host may have connected; nil: never.
	wake <-chan os.Signal
	// poll bounds a wait for wake, in case a notification is lost. Zero:
	// a 0-byte read is always EOF, as for a socket (vsock), where it
	// means that the peer closed.
	poll time.Duration
	// connected, if set, runs once when the first bytes arrive: the port
	// then stops signalling (virtio_console raises SIGIO on every host
	// write too, and a signal pending on a thread makes, e.g., the BPF
	// verifier give up with EAGAIN).
	connected func()
	// catchUp bounds how long a connection that read the host's request
	// and wrote nothing yet takes 0-byte reads as the driver not having
	// handled the host's connect yet (its control messages go through a
	// workqueue, the data straight from the ring), reading again every
	// catchUpStep, before it takes them as EOF. Zero: EOF at once.
	catchUp time.Duration
	// unanswered, if set, runs when such a connection either ends (kept
	// false: the driver did not catch up within catchUp) or reads data
	// again (kept true; waited is then the time from the first 0-byte
	// read to that data): docs/agent-channel.md, "A guest that closes its
	// port unanswered".
	unanswered func(waited time.Duration, kept bool)

	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed by Close

	// wrote is set once a Write wrote bytes.
	wrote atomic.Bool

	// mu guards gotData and readDeadline.
	mu sync.Mutex
	// gotData is set once a Read returned bytes (the host is connected).
	gotData bool
	// readDeadline is the last one set; a wait for the host ends there.
	readDeadline time.Time
}

func newFileConn(rwc io.ReadWriteCloser, addr Addr) *fileConn {
	return &fileConn{rwc: rwc, addr: addr, done: make(chan struct{})}
}

// catchUpStep is how often a connection waiting for the driver to catch
// up reads again (fileConn.catchUp).
const catchUpStep = 10 * time.Millisecond

// Read reads from the stream. On a port (c.poll set) a 0-byte read
// (os.File reports it as EOF) means that no host is connected: before the
// connection has read anything, Read waits for the host and reads again;
// after, it is EOF, unless nothing was written yet: then the driver may
// not have handled the host's connect yet, and Read reads again for up to
// c.catchUp before it ends the connection.
func (c *fileConn) Read(b []byte) (int, error) {
	var behind time.Time // the first 0-byte read after data, unanswered
	for {
		n, err := c.rwc.Read(b)
		if n > 0 {
			c.mu.Lock()
			first := !c.gotData
			c.gotData = true
			c.mu.Unlock()
			if first && c.connected != nil {
				c.connected()
			}
			if !behind.IsZero() && c.unanswered != nil {
				c.unanswered(time.Since(behind), true)
			}
			return n, err
		}
		if len(b) == 0 || err != nil && err != io.EOF {
			return n, err
		}
		if c.poll == 0 {
			return 0, io.EOF
		}
		if !c.used() {
			if err := c.waitForHost(); err != nil {
				return 0, err
			}
			continue
		}
		if c.wrote.Load() {
			return 0, io.EOF
		}
		now := time.Now()
		if behind.IsZero() {
			behind = now
		}
		if now.Sub(behind) >= c.catchUp {
			if c.unanswered != nil {
				c.unanswered(now.Sub(behind), false)
			}
			return 0, io.EOF
		}
		select {
		case <-time.After(catchUpStep):
		case <-c.done:
			return 0, net.ErrClosed
		}
	}
}

// waitForHost returns when the host may have connected (a wake-up, or
// c.poll passed), or with an error when the connection is closed or its
// read deadline passed.
func (c *fileConn) waitForHost() error {
	wait := c.poll
	c.mu.Lock()
	deadline := c.readDeadline
	c.mu.Unlock()
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			return os.ErrDeadlineExceeded
		}
		wait = min(wait, left)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-c.wake:
	case <-t.C:
	case <-c.done:
		return net.ErrClosed
	}
	return nil
}

func (c *fileConn) Write(b []byte) (int, error) {
	n, err := c.rwc.Write(b)
	if n > 0 {
		c.wrote.Store(true)
	}
	return n, err
}

func (c *fileConn) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = c.rwc.Close()
		close(c.done)
	})
	return c.closeErr
}

func (c *fileConn) used() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gotData
}

func (c *fileConn) LocalAddr() net.Addr  { return c.addr }
func (c *fileConn) RemoteAddr() net.Addr { return c.addr }

type deadliner interface {
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

func (c *fileConn) SetDeadline(t time.Time) error {
	c.setReadDeadline(t)
	if d, ok := c.rwc.(deadliner); ok {
		return d.SetDeadline(t)
	}
	return nil
}

func (c *fileConn) SetReadDeadline(t time.Time) error {
	c.setReadDeadline(t)
	if d, ok := c.rwc.(deadliner); ok {
		return d.SetReadDeadline(t)
	}
	return nil
}

// setReadDeadline records t for waitForHost, which the stream's own
// deadline does not reach.
func (c *fileConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	c.readDeadline = t
	c.mu.Unlock()
}

func (c *fileConn) SetWriteDeadline(t time.Time) error {
	if d, ok := c.rwc.(deadliner); ok {
		return d.SetWriteDeadline(t)
	}
	return nil
}

// Backoff bounds for reopening a port whose host side is not connected.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = time.Second
)

// PortListener hands out one connection at a time over a device that is
// reopened for each connection. A connection waits in Read until the host
// connects (see the package comment). A connection that ended without
// reading anything (closed, or a read failed) and a failed open make the
// next open wait (doubling up to one second), so it never busy-loops.
type PortListener struct {
	open func() (io.ReadWriteCloser, error)
	addr Addr
	// wake receives when the host may have connected (SIGIO, for
	// ListenPort); nil: connections poll every poll.
	wake <-chan os.Signal
	// poll bounds a connection's wait for wake.
	poll time.Duration
	// unsubscribe stops the deliveries to wake (nil: none to stop).
	unsubscribe func()
	// catchUp and unanswered: fileConn's.
	catchUp    time.Duration
	unanswered func(waited time.Duration, kept bool)

	closed    chan struct{}
	closeOnce sync.Once

	// mu guards cur and backoff.
	mu      sync.Mutex
	cur     *fileConn
	backoff time.Duration
}

// NewPortListener returns a listener that opens the port with open. Its
// connections learn that the host connected by reading again once a
// second.
func NewPortListener(open func() (io.ReadWriteCloser, error), addr Addr) *PortListener {
	return newPortListener(open, addr, nil)
}

func newPortListener(open func() (io.ReadWriteCloser, error), addr Addr, wake <-chan os.Signal) *PortListener {
	return &PortListener{open: open, addr: addr, wake: wake, poll: maxBackoff, catchUp: driverCatchUp, unanswered: reportUnanswered, closed: make(chan struct{})}
}

// driverCatchUp is how long a connection with an unanswered request
// waits for the port's driver to count the host as connected. A guest
// that had the request at once handled the connect within ≈ 30 ms of it
// (docs/agent-channel.md); one that missed the interrupts is better off
// closing its port soon, which makes the host connect again.
const driverCatchUp = 500 * time.Millisecond

// reportUnanswered reports a connection that read the host's request and
// then found the host gone before it could answer: the port's driver had
// not learnt that the host connected. It names the interrupt counts of
// the virtio devices, for telling whether the driver's interrupts came.
func reportUnanswered(waited time.Duration, kept bool) {
	irqs := virtioInterrupts("/proc/interrupts")
	if kept {
		slog.Info("the port's driver counted the host as connected late; session kept",
			"next_data_after", waited.Round(time.Millisecond), "virtio_interrupts", irqs)
		return
	}
	slog.Warn("the host's request could not be answered: the port's driver does not count the host as connected; ending the session (the port is opened again)",
		"waited", waited.Round(time.Millisecond), "virtio_interrupts", irqs)
}

// virtioInterrupts is the lines of path (a /proc/interrupts) that name a
// virtio device, spaces squeezed, joined by "; ".
func virtioInterrupts(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "virtio") {
			lines = append(lines, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(lines, "; ")
}

// ListenPort listens on a virtio-serial port device. It subscribes to
// SIGIO, which the port sends when the host connects, so that a waiting
// connection reads again at once.
func ListenPort(dev string) *PortListener {
	// One slot: a notification that arrives while nobody waits is kept
	// for the next wait, and more of them add nothing.
	sigio := make(chan os.Signal, 1)
	signal.Notify(sigio, unix.SIGIO)
	l := newPortListener(func() (io.ReadWriteCloser, error) {
		return openPort(dev)
	}, Addr{Net: "virtio-serial", Name: dev}, sigio)
	l.unsubscribe = func() { signal.Stop(sigio) }
	return l
}

// openPort opens dev for reading and writing and asks for SIGIO. A port
// that cannot signal is still returned, with a warning: its connections
// notice the host by polling, which is slower but works.
func openPort(dev string) (*os.File, error) {
	// os.OpenFile registers the char device with the poller (O_NONBLOCK),
	// so Close unblocks a Read.
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	if err := setAsync(f, true); err != nil {
		slog.Warn("the agent channel will notice the host by polling", "err", err)
	}
	return f, nil
}

// setAsync makes f send SIGIO to this process (on): F_SETOWN to our pid,
// then O_ASYNC added to f's flags with F_SETFL (which, unlike O_ASYNC
// given to open, registers the file with the driver's fasync list), or
// stop (off: O_ASYNC cleared). virtio_console signals when the host
// connects or disconnects and when data arrives.
func setAsync(f *os.File, on bool) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("asking %s for SIGIO: %w", f.Name(), err)
	}
	var opErr error
	err = sc.Control(func(fd uintptr) {
		// fcntl(fd, F_SETOWN, getpid())
		if _, err := unix.FcntlInt(fd, unix.F_SETOWN, os.Getpid()); err != nil {
			opErr = fmt.Errorf("setting the owner of %s: %w", f.Name(), err)
			return
		}
		// fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC)
		flags, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err != nil {
			opErr = fmt.Errorf("reading the flags of %s: %w", f.Name(), err)
			return
		}
		if on {
			flags |= unix.O_ASYNC
		} else {
			flags &^= unix.O_ASYNC
		}
		if _, err := unix.FcntlInt(fd, unix.F_SETFL, flags); err != nil {
			opErr = fmt.Errorf("setting O_ASYNC on %s to %v: %w", f.Name(), on, err)
		}
	})
	if err != nil {
		return fmt.Errorf("asking %s for SIGIO: %w", f.Name(), err)
	}
	return opErr
}

// Accept waits until the previous connection is closed, then opens the
// port again.
func (l *PortListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	prev := l.cur
	l.mu.Unlock()
	if prev != nil {
		select {
		case <-prev.done:
		case <-l.closed:
			return nil, net.ErrClosed
		}
		l.mu.Lock()
		if prev.used() {
			l.backoff = 0
		} else if l.backoff == 0 {
			l.backoff = minBackoff
		} else {
			l.backoff = min(2*l.backoff, maxBackoff)
		}
		l.mu.Unlock()
	}
	for {
		l.mu.Lock()
		wait := l.backoff
		l.mu.Unlock()
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		select {
		case <-l.closed:
			return nil, net.ErrClosed
		default:
		}
		rwc, err := l.open()
		if err != nil {
			// The port may be busy until the kernel released the last
			// open; try again, more slowly.
			l.mu.Lock()
			l.backoff = min(max(2*l.backoff, minBackoff), maxBackoff)
			l.mu.Unlock()
			continue
		}
		c := newFileConn(rwc, l.addr)
		c.wake, c.poll, c.catchUp, c.unanswered = l.wake, l.poll, l.catchUp, l.unanswered
		if f, ok := rwc.(*os.File); ok && l.wake != nil {
			c.connected = func() {
				if err := setAsync(f, false); err != nil {
					slog.Warn("the agent channel keeps signalling", "err", err)
				}
			}
		}
		l.mu.Lock()
		l.cur = c
		l.mu.Unlock()
		return c, nil
	}
}

// Close stops Accept and closes the current connection.
func (l *PortListener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		if l.unsubscribe != nil {
			l.unsubscribe()
		}
	})
	l.mu.Lock()
	c := l.cur
	l.mu.Unlock()
	if c != nil {
		return c.Close()
	}
	return nil
}

func (l *PortListener) Addr() net.Addr { return l.addr }

// Backoff reports the current reopen delay (for tests and logs).
func (l *PortListener) Backoff() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.backoff
}

var _ net.Listener = (*PortListener)(nil)

// ErrNoChannel is returned when no agent channel can be found.
var ErrNoChannel = errors.New("no agent channel")
