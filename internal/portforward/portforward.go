// Package portforward makes CRI PortForward reach a VM pod's workload.
// containerd's CRI dials 127.0.0.1:PORT inside the pod's network
// namespace on the host, where nothing listens: the workload listens in
// the VM. A Forwarder attaches an sk_lookup program (sklookup.go) to the
// pod netns that hands every TCP connection to 127.0.0.1 there, whatever
// its port, to one listener of the shim's; the accepted connection's
// local address still names the port that was dialed, and the Forwarder
// relays it to that port in the guest. Nothing is added to the netns
// itself (no links, addresses, routes or netfilter rules): the program is
// attached only while the shim holds the link's descriptor, so the kernel
// detaches it when the shim closes it or dies. See docs/port-forward.md.
package portforward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Conn is the guest end of a forwarded connection.
type Conn interface {
	io.ReadWriteCloser
	// CloseWrite tells the guest side that no more bytes come.
	CloseWrite() error
}

// DialFunc opens a connection to port on the guest's 127.0.0.1.
type DialFunc func(ctx context.Context, port int) (Conn, error)

// Forwarder relays connections to 127.0.0.1 in one netns to the guest.
type Forwarder struct {
	netns string
	dial  DialFunc
	log   *slog.Logger
	ln    *net.TCPListener
	link  int // the sk_lookup link; the program is attached while it is open

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// Start attaches the steering program to the network namespace at
// netnsPath and starts relaying to dial.
func Start(netnsPath string, dial DialFunc, log *slog.Logger) (_ *Forwarder, retErr error) {
	ns, err := os.Open(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("port forwarding: opening network namespace %s: %w", netnsPath, err)
	}
	defer ns.Close()
	if t, err := unix.IoctlRetInt(int(ns.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return nil, fmt.Errorf("port forwarding: %s is not a network namespace", netnsPath)
	}
	ln, err := listenIn(int(ns.Fd()), netnsPath)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			ln.Close()
		}
	}()
	link, err := steer(ln, int(ns.Fd()))
	if err != nil {
		return nil, fmt.Errorf("port forwarding in network namespace %s: %w", netnsPath, err)
	}
	f := &Forwarder{netns: netnsPath, dial: dial, log: log, ln: ln, link: link}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// listenIn opens a TCP listener on 127.0.0.1 (an ephemeral port) in the
// network namespace nsFD. A socket stays in the namespace it was created
// in: only socket() runs on a thread that entered it.
func listenIn(nsFD int, path string) (*net.TCPListener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("port forwarding: opening this thread's network namespace: %w", err)}
			return
		}
		defer orig.Close()
		// setns(<pod netns>, CLONE_NEWNET), as `ip netns exec` does
		if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: fmt.Errorf("port forwarding: entering network namespace %s: %w", path, err)}
			return
		}
		// Plain TCP: Go listens with MPTCP by default where the kernel
		// has it, and a sockmap takes no MPTCP socket (EOPNOTSUPP).
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
		if err != nil {
			err = fmt.Errorf("port forwarding: listening on 127.0.0.1 in network namespace %s: %w", path, err)
		}
		// Back home; a thread that cannot go back stays locked and dies
		// with this goroutine.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		ch <- result{ln, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, r.err
	}
	return r.ln.(*net.TCPListener), nil
}

// steer puts ln in a sockmap and attaches the program that hands it every
// TCP connection to 127.0.0.1 in the namespace nsFD; it returns the link.
func steer(ln *net.TCPListener, nsFD int) (int, error) {
	mapFD, err := newSockmap()
	if err != nil {
		return -1, err
	}
	defer unix.Close(mapFD) // the program holds the map
	rc, err := ln.SyscallConn()
	if err != nil {
		return -1, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = sockmapSet(mapFD, int(fd)) }); err != nil {
		return -1, err
	}
	if serr != nil {
		return -1, serr
	}
	progFD, err := loadProgram(mapFD)
	if err != nil {
		return -1, err
	}
	defer unix.Close(progFD) // the link holds the program
	return attach(progFD, nsFD)
}

// Close detaches the program, stops accepting and ends the connections
// being relayed. Idempotent.
func (f *Forwarder) Close() error {
	var err error
	f.once.Do(func() {
		err = unix.Close(f.link)
		if cerr := f.ln.Close(); err == nil {
			err = cerr
		}
		f.cancel()
		f.wg.Wait()
		if err != nil {
			err = fmt.Errorf("port forwarding in network namespace %s: closing: %w", f.netns, err)
		}
	})
	return err
}

func (f *Forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.AcceptTCP()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				f.log.Warn("port forwarding: accept", "netns", f.netns, "error", err)
			}
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.relay(c)
		}()
	}
}

// relay carries one connection to the port it was dialed at in the
// guest, half-closes passed on both ways, until both sides are done (or
// lingerAfterEOF after the first) or the Forwarder closes.
func (f *Forwarder) relay(c *net.TCPConn) {
	defer c.Close()
	port := c.LocalAddr().(*net.TCPAddr).Port
	g, err := f.dial(f.ctx, port)
	if err != nil {
		f.log.Warn("port forwarding: connecting to the guest", "port", port, "error", err)
		return
	}
	defer g.Close()
	done := make(chan struct{}, 2)
	go func() {
		io.Copy(g, c)
		g.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		io.Copy(c, g)
		c.CloseWrite()
		done <- struct{}{}
	}()
	select {
	case <-done:
	case <-f.ctx.Done():
		return // the deferred closes end both copies
	}
	// One way is done. containerd closes the whole connection at most a
	// second after one of its copies ended (sandbox_portforward_linux.go),
	// so a guest that never closes its side cannot hold the relay (and a
	// connection in the agent) past lingerAfterEOF.
	t := time.NewTimer(lingerAfterEOF)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-f.ctx.Done():
	}
}

// lingerAfterEOF bounds how long the second direction of a relay may go
// on after the first ended.
const lingerAfterEOF = 5 * time.Second
