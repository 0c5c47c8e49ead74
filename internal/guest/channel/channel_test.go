package channel

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

func TestFindPort(t *testing.T) {
	sys := t.TempDir()
	for port, name := range map[string]string{"vport0p1": "org.qemu.guest_agent.0", "vport1p1": "hull.agent"} {
		os.MkdirAll(filepath.Join(sys, port), 0o755)
		os.WriteFile(filepath.Join(sys, port, "name"), []byte(name+"\n"), 0o644)
	}
	os.MkdirAll(filepath.Join(sys, "vport2p1"), 0o755) // no name yet
	got, err := FindPort(sys, "/dev", PortName)
	if err != nil || got != "/dev/vport1p1" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := FindPort(sys, "/dev", "other"); err == nil {
		t.Fatal("found a port that does not exist")
	}
}

func TestWaitPortTimesOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := WaitPort(ctx, t.TempDir(), "/dev", PortName); err == nil {
		t.Fatal("no error for a missing port")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v", d)
	}
}

// socketpair returns two connected stream ends as files.
func socketpair(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "guest"), os.NewFile(uintptr(fds[1]), "host")
}

type eofPort struct{}

func (eofPort) Read([]byte) (int, error)    { return 0, io.EOF }
func (eofPort) Write(b []byte) (int, error) { return len(b), nil }
func (eofPort) Close() error                { return nil }

// A disconnected host must not make the listener spin: opens back off.
func TestListenerBacksOffWhileDisconnected(t *testing.T) {
	var opens atomic.Int32
	l := NewPortListener(func() (io.ReadWriteCloser, error) {
		opens.Add(1)
		return eofPort{}, nil
	}, Addr{"test", "test"})
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 10)
			c.Read(buf) // EOF at once, like an unconnected virtio port
			c.Close()
		}
	}()
	time.Sleep(1500 * time.Millisecond)
	// 50+100+200+400+800 ms: at most 6 opens in 1.5 s.
	if n := opens.Load(); n > 6 || n < 3 {
		t.Fatalf("%d opens in 1.5s, want 3..6", n)
	}
	if b := l.Backoff(); b < 400*time.Millisecond || b > maxBackoff {
		t.Fatalf("backoff %v", b)
	}
}

type pingService struct{ agent.AgentService }

func (pingService) Ping(context.Context, *agent.PingRequest) (*agent.PingResponse, error) {
	return &agent.PingResponse{AgentVersion: "test"}, nil
}

// The host disconnects and reconnects; the agent serves each connection in
// turn on a fresh open.
func TestListenerServesReconnects(t *testing.T) {
	hosts := make(chan *os.File, 4)
	l := NewPortListener(func() (io.ReadWriteCloser, error) {
		g, h := socketpair(t)
		hosts <- h
		return g, nil
	}, Addr{"test", "test"})
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agent.RegisterAgentService(srv, pingService{})
	go srv.Serve(context.Background(), l)
	defer srv.Close()

	for i := 0; i < 3; i++ {
		var h *os.File
		select {
		case h = <-hosts:
		case <-time.After(3 * time.Second):
			t.Fatalf("round %d: listener did not reopen", i)
		}
		conn, err := net.FileConn(h)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		client := ttrpc.NewClient(conn)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := agent.NewAgentClient(client).Ping(ctx, &agent.PingRequest{})
		cancel()
		if err != nil || resp.AgentVersion != "test" {
			t.Fatalf("round %d: ping: %v %v", i, resp, err)
		}
		client.Close()
	}
}
