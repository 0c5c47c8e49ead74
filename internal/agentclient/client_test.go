package agentclient

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
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

// dialUntilVMExit dials sock with a VM that exits after exitAfter and
// fails the test unless Dial reports ErrVMExited, soon after the exit
// rather than at its 5 s deadline.
func dialUntilVMExit(t *testing.T, sock string, exitAfter time.Duration) {
	t.Helper()
	vmDone := make(chan struct{})
	time.AfterFunc(exitAfter, func() { close(vmDone) })
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
	dialUntilVMExit(t, sock, 100*time.Millisecond)

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
	// QEMU exited (nothing listens any more); its exit is reaped later.
	l.Close()
	dialUntilVMExit(t, sock, 150*time.Millisecond)

	// A refused connect with a VM that runs on is an error of its own,
	// when the deadline passes, naming the socket.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	_, _, err := Dial(ctx2, sock, make(chan struct{}))
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

// portEvents stands for QEMU's reports of the guest opening and closing
// its port (VSERPORT_CHANGE): a watch's channel is closed by the next
// matching report made after it started, as qemu.WatchAgentPort's is.
type portEvents struct {
	mu   sync.Mutex
	subs map[chan struct{}]bool // channel -> open
}

func newPortEvents() *portEvents { return &portEvents{subs: map[chan struct{}]bool{}} }

func (p *portEvents) watch(open bool) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	p.mu.Lock()
	p.subs[ch] = open
	p.mu.Unlock()
	return ch, func() {
		p.mu.Lock()
		delete(p.subs, ch)
		p.mu.Unlock()
	}
}

func (p *portEvents) report(open bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch, o := range p.subs {
		if o == open {
			close(ch)
			delete(p.subs, ch)
		}
	}
}

// guestSessions plays the guest's end of the agent socket: session n (from
// 1) of the host's connections runs sessions[n-1] on it, and those past
// the list are answered by a real agent service.
func guestSessions(t *testing.T, l net.Listener, svc agent.AgentService, sessions ...func(net.Conn)) {
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agent.RegisterAgentService(srv, svc)
	t.Cleanup(func() { srv.Close() })
	go func() {
		for _, session := range sessions {
			c, err := l.Accept()
			if err != nil {
				return
			}
			// QEMU keeps the host's connection when the guest closes
			// its port: the host learns of it from QEMU's reports only.
			t.Cleanup(func() { c.Close() })
			c.Read(make([]byte, 512)) // the host's Ping, never answered
			session(c)
		}
		srv.Serve(context.Background(), l)
	}()
}

// A guest that takes the first connection's Ping and closes its end of
// the channel without answering (a clone that missed the connect's
// notification) is connected to again, once its port is open again, and
// the second connection's agent answers.
func TestDialWatchingConnectsAgainWhenTheGuestClosesItsPort(t *testing.T) {
	sock, l := listenAgent(t)
	ev := newPortEvents()
	svc := &pingOnly{}
	guestSessions(t, l, svc, func(net.Conn) {
		ev.report(false)
		time.Sleep(300 * time.Millisecond) // the agent opens its port again
		ev.report(true)
	})
	begin := time.Now()
	var retries []int
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, ping, err := DialWatching(ctx, sock, nil, ev.watch, func(attempt int, err error) { retries = append(retries, attempt) })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ping.BootId != "boot-2" || len(retries) != 1 || retries[0] != 1 {
		t.Errorf("boot id %q, retries %v: want the second connection's answer after one retry", ping.BootId, retries)
	}
	if d := time.Since(begin); d < 300*time.Millisecond {
		t.Errorf("answered after %v: the second connection did not wait for the port to open again", d)
	}
	if n := svc.pings.Load(); n < 2 {
		t.Errorf("%d pings answered, want the Ping and the clock's", n)
	}
}

// QEMU reports a port's changes at most once a second, the last one of
// the second: a guest that closes and opens its port again within it
// shows only as "open". Seen with a clone's second connection, which then
// waited 20 s for an answer that could not come. A connection made to a
// port known to be open takes any report as the port having cycled.
func TestDialWatchingSeesACloseHiddenByTheRateLimit(t *testing.T) {
	sock, l := listenAgent(t)
	ev := newPortEvents()
	guestSessions(t, l, &pingOnly{},
		func(net.Conn) { ev.report(false); ev.report(true) },
		func(net.Conn) { ev.report(true) }, // closed and opened again within QEMU's second
	)
	var retries []int
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, ping, err := DialWatching(ctx, sock, nil, ev.watch, func(attempt int, err error) { retries = append(retries, attempt) })
	if err != nil {
		t.Fatalf("%v (retries %v): the second connection's lost Ping was waited for", err, retries)
	}
	defer c.Close()
	if ping.BootId != "boot-2" || len(retries) != 2 {
		t.Errorf("boot id %q, retries %v: want the third connection's answer after two retries", ping.BootId, retries)
	}
}

// A guest that closes its port on every connection is given up on after
// maxDials connections, with ErrPortClosed (a clone is then booted).
func TestDialWatchingGivesUp(t *testing.T) {
	sock, l := listenAgent(t)
	ev := newPortEvents()
	var sessions []func(net.Conn)
	accepted := make(chan int, maxDials+1)
	for n := 1; n <= maxDials+1; n++ {
		sessions = append(sessions, func(net.Conn) {
			accepted <- n
			ev.report(false)
			ev.report(true) // the guest is back at once
		})
	}
	guestSessions(t, l, &pingOnly{}, sessions...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _, err := DialWatching(ctx, sock, nil, ev.watch, nil)
	if !errors.Is(err, ErrPortClosed) || !strings.Contains(err.Error(), "(3 connections)") {
		t.Fatalf("err = %v, want the port closed after 3 connections", err)
	}
	if len(accepted) != maxDials {
		t.Errorf("%d connections, want %d", len(accepted), maxDials)
	}
}
