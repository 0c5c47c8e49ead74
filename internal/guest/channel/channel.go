// Package channel provides the agent's end of the host channel as a
// net.Listener: a virtio-serial port (a character device, wrapped as a
// one-connection-at-a-time listener) or a vsock socket.
package channel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
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

	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed by Close
	// gotData is set once a Read returned bytes (the host is connected).
	mu      sync.Mutex
	gotData bool
}

func newFileConn(rwc io.ReadWriteCloser, addr Addr) *fileConn {
	return &fileConn{rwc: rwc, addr: addr, done: make(chan struct{})}
}

func (c *fileConn) Read(b []byte) (int, error) {
	n, err := c.rwc.Read(b)
	if n > 0 {
		c.mu.Lock()
		c.gotData = true
		c.mu.Unlock()
	}
	if n == 0 && err == nil && len(b) > 0 {
		// The virtio port reads 0 while the host side is disconnected.
		err = io.EOF
	}
	return n, err
}

func (c *fileConn) Write(b []byte) (int, error) { return c.rwc.Write(b) }

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
	if d, ok := c.rwc.(deadliner); ok {
		return d.SetDeadline(t)
	}
	return nil
}

func (c *fileConn) SetReadDeadline(t time.Time) error {
	if d, ok := c.rwc.(deadliner); ok {
		return d.SetReadDeadline(t)
	}
	return nil
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
// reopened for each connection. A connection that ended without reading
// anything means the host side is not connected: the next Accept waits
// (doubling up to one second) before opening again, so it never busy-loops.
type PortListener struct {
	open func() (io.ReadWriteCloser, error)
	addr Addr

	closed    chan struct{}
	closeOnce sync.Once

	// mu guards cur and backoff.
	mu      sync.Mutex
	cur     *fileConn
	backoff time.Duration
}

// NewPortListener returns a listener that opens the port with open.
func NewPortListener(open func() (io.ReadWriteCloser, error), addr Addr) *PortListener {
	return &PortListener{open: open, addr: addr, closed: make(chan struct{})}
}

// ListenPort listens on a virtio-serial port device.
func ListenPort(dev string) *PortListener {
	return NewPortListener(func() (io.ReadWriteCloser, error) {
		// os.OpenFile registers the char device with the poller, so Close
		// unblocks a Read.
		return os.OpenFile(dev, os.O_RDWR, 0)
	}, Addr{Net: "virtio-serial", Name: dev})
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
		l.mu.Lock()
		l.cur = c
		l.mu.Unlock()
		return c, nil
	}
}

// Close stops Accept and closes the current connection.
func (l *PortListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
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
