package agentclient

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// listenAgent listens where QEMU's agent socket would be; the listener
// is closed at the test's end.
func listenAgent(t *testing.T) (string, net.Listener) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return sock, l
}

// A VM that exits while the host waits for its agent ends the wait at once
// with ErrVMExited, not at the deadline.
func TestDialGivesUpWhenTheVMExits(t *testing.T) {
	sock, l := listenAgent(t)
	go func() { // QEMU's side: accepts, and the guest never answers
		c, err := l.Accept()
		if err == nil {
			defer c.Close()
			time.Sleep(10 * time.Second)
		}
	}()
	vmDone := make(chan struct{})
	time.AfterFunc(100*time.Millisecond, func() { close(vmDone) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := Dial(ctx, sock, vmDone)
	if !errors.Is(err, ErrVMExited) {
		t.Fatalf("err = %v, want ErrVMExited", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Dial took %v after the VM exited", d)
	}

	// Without a VM signal, the deadline bounds the wait.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if _, _, err := Dial(ctx2, sock, nil); err == nil || errors.Is(err, ErrVMExited) {
		t.Fatalf("err = %v, want the deadline", err)
	}
}

// A VM whose QEMU has already closed its agent socket when the host
// connects (a clone whose guest reset at once) refuses the connect before
// its exit is reaped: Dial waits for the exit and reports ErrVMExited (the
// caller boots the pod instead), not the refused connect.
func TestDialRefusedByAnExitingVM(t *testing.T) {
	sock, l := listenAgent(t)
	l.Close() // QEMU exited: nothing listens any more
	vmDone := make(chan struct{})
	time.AfterFunc(150*time.Millisecond, func() { close(vmDone) }) // reaped later
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := Dial(ctx, sock, vmDone)
	if !errors.Is(err, ErrVMExited) {
		t.Fatalf("err = %v, want ErrVMExited", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Dial took %v after the VM exited", d)
	}

	// A refused connect with a VM that runs on is an error of its own,
	// when the deadline passes, naming the socket.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	_, _, err = Dial(ctx2, sock, make(chan struct{}))
	if err == nil || errors.Is(err, ErrVMExited) || !strings.Contains(err.Error(), sock) {
		t.Fatalf("err = %v, want the refused connect to %s", err, sock)
	}
}

// pingOnly answers Ping (with a time, for the clock's measure); the other
// calls are not made.
type pingOnly struct {
	agent.AgentService
	pings atomic.Int32
}

func (p *pingOnly) Ping(context.Context, *agent.PingRequest) (*agent.PingResponse, error) {
	p.pings.Add(1)
	return &agent.PingResponse{BootId: "boot-2", TimeUnixNs: time.Now().UnixNano()}, nil
}

// A guest that takes the first connection's Ping and closes its end of
// the channel without answering (a clone that missed the connect's
// notification) is connected to again, and the second connection's agent
// answers.
func TestDialWatchingConnectsAgainWhenTheGuestClosesItsPort(t *testing.T) {
	sock, l := listenAgent(t)
	portClosed, portOpened := make(chan struct{}, 1), make(chan struct{})
	svc := &pingOnly{}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agent.RegisterAgentService(srv, svc)
	defer srv.Close()
	go func() {
		c, err := l.Accept() // the first: read, then the guest closes its port
		if err != nil {
			return
		}
		c.Read(make([]byte, 512))
		portClosed <- struct{}{}
		time.Sleep(300 * time.Millisecond) // the agent opens its port again
		close(portOpened)
		c.Close()
		srv.Serve(context.Background(), l) // the next ones: answered
	}()
	watches := 0
	watch := func(open bool) (<-chan struct{}, func()) {
		if open {
			return portOpened, func() {}
		}
		watches++
		return portClosed, func() {}
	}
	begin := time.Now()
	var retries []int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, ping, err := DialWatching(ctx, sock, nil, watch, func(attempt int, err error) { retries = append(retries, attempt) })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ping.BootId != "boot-2" || len(retries) != 1 || retries[0] != 1 || watches != 2 {
		t.Errorf("boot id %q, retries %v, %d watches: want the second connection's answer after one retry", ping.BootId, retries, watches)
	}
	if d := time.Since(begin); d < 300*time.Millisecond {
		t.Errorf("answered after %v: the second connection did not wait for the port to open again", d)
	}
	if n := svc.pings.Load(); n < 2 {
		t.Errorf("%d pings answered, want the Ping and the clock's", n)
	}
}

// A guest that closes its port at every connection fails the dial after
// maxDials connections, with an error that says why.
func TestDialWatchingGivesUp(t *testing.T) {
	sock, l := listenAgent(t)
	portClosed := make(chan struct{}, 1)
	accepted := make(chan int, maxDials+1)
	go func() {
		for n := 1; ; n++ {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- n
			c.Read(make([]byte, 512))
			portClosed <- struct{}{}
			defer c.Close()
		}
	}()
	reopened := make(chan struct{})
	close(reopened) // the guest is always back at once
	watch := func(open bool) (<-chan struct{}, func()) {
		if open {
			return reopened, func() {}
		}
		return portClosed, func() {}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := DialWatching(ctx, sock, nil, watch, nil)
	if !errors.Is(err, errPortClosed) || !strings.Contains(err.Error(), "(3 connections)") {
		t.Fatalf("err = %v, want the port closed after 3 connections", err)
	}
	if len(accepted) != maxDials {
		t.Errorf("%d connections, want %d", len(accepted), maxDials)
	}
}
