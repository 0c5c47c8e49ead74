package portforward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// newNetns makes a named network namespace with lo up, removed at cleanup.
func newNetns(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, bpf)")
	}
	name := fmt.Sprintf("hull-pf-%d", os.Getpid())
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// dialIn dials addr from inside the namespace at path.
func dialIn(path, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		ns, err := os.Open(path)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, err}
			return
		}
		c, err := net.DialTimeout("tcp4", addr, 5*time.Second)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// pipeConn is a fake guest: an in-memory connection whose far end
// upper-cases what it reads until the half-close.
type pipeConn struct{ net.Conn }

func (p pipeConn) CloseWrite() error { return p.Conn.(*net.TCPConn).CloseWrite() }

func upperServer(t *testing.T) (string, *sync.Map) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				c.Write([]byte(strings.ToUpper(string(b))))
			}()
		}
	}()
	return ln.Addr().String(), &sync.Map{}
}

func TestForwarderRelaysEveryLoopbackPort(t *testing.T) {
	path := newNetns(t)
	guest, seen := upperServer(t)
	dial := func(ctx context.Context, port int) (Conn, error) {
		seen.Store(port, true)
		c, err := net.Dial("tcp4", guest)
		if err != nil {
			return nil, err
		}
		return pipeConn{c}, nil
	}
	f, err := Start(path, dial, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if n := attachedIn(t, path); n != 1 {
		t.Errorf("%d sk_lookup programs attached while forwarding, want 1", n)
	}
	for _, port := range []int{80, 8080, 31337} {
		c, err := dialIn(path, fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d: %v", port, err)
		}
		c.Write([]byte("hello"))
		c.(*net.TCPConn).CloseWrite()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "HELLO" {
			t.Errorf("port %d: read %q, %v; want HELLO", port, got, err)
		}
		if _, ok := seen.Load(port); !ok {
			t.Errorf("port %d: the guest was not dialed at that port", port)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// Detached: the namespace is as it was, nothing listens.
	if n := attachedIn(t, path); n != 0 {
		t.Errorf("%d sk_lookup programs attached after Close, want 0", n)
	}
	if c, err := dialIn(path, "127.0.0.1:80"); !errors.Is(err, unix.ECONNREFUSED) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial after Close: %v, want connection refused", err)
	}
}

func TestForwarderGuestRefuses(t *testing.T) {
	path := newNetns(t)
	dial := func(ctx context.Context, port int) (Conn, error) {
		return nil, errors.New("nothing listens")
	}
	f, err := Start(path, dial, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := dialIn(path, "127.0.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Errorf("read %q, %v: want an immediate EOF", b, err)
	}
}

func TestStartBadNetns(t *testing.T) {
	if _, err := Start("/nonexistent/netns", nil, slog.Default()); err == nil || !strings.Contains(err.Error(), "/nonexistent/netns") {
		t.Errorf("Start on a missing netns: %v, want an error naming it", err)
	}
	if _, err := Start("/etc/hostname", nil, slog.Default()); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("Start on a regular file: %v", err)
	}
}

func attachedIn(t *testing.T, path string) int {
	t.Helper()
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	n, err := AttachedPrograms(int(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// closeRecorder notes when the relay closes the guest end.
type closeRecorder struct {
	pipeConn
	closed chan struct{}
}

func (c closeRecorder) Close() error {
	close(c.closed)
	return c.pipeConn.Close()
}

// A guest side that never closes holds the relay at most lingerAfterEOF
// after the host side ended.
func TestForwarderGuestNeverCloses(t *testing.T) {
	path := newNetns(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		io.Copy(io.Discard, c) // reads to EOF, never answers, never closes
		<-time.After(time.Minute)
		c.Close()
	}()
	closed := make(chan struct{})
	dial := func(ctx context.Context, port int) (Conn, error) {
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return nil, err
		}
		return closeRecorder{pipeConn{c}, closed}, nil
	}
	f, err := Start(path, dial, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := dialIn(path, "127.0.0.1:5000")
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("x"))
	c.Close()
	start := time.Now()
	select {
	case <-closed:
		if d := time.Since(start); d < lingerAfterEOF-time.Second {
			t.Errorf("guest end closed after %v, before lingerAfterEOF (%v)", d, lingerAfterEOF)
		}
	case <-time.After(lingerAfterEOF + 5*time.Second):
		t.Fatalf("guest end still open %v after the host side closed", lingerAfterEOF+5*time.Second)
	}
}
