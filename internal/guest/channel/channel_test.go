package channel

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// failingPort is a port whose reads fail, as a broken device's would.
type failingPort struct{}

func (failingPort) Read([]byte) (int, error)    { return 0, unix.EIO }
func (failingPort) Write(b []byte) (int, error) { return len(b), nil }
func (failingPort) Close() error                { return nil }

// A port whose connections end without reading must not make the listener
// spin: opens back off.
func TestListenerBacksOffAfterFailedReads(t *testing.T) {
	var opens atomic.Int32
	l := NewPortListener(func() (io.ReadWriteCloser, error) {
		opens.Add(1)
		return failingPort{}, nil
	}, Addr{"test", "test"})
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 10)
			c.Read(buf) // fails at once
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

// A port that cannot be opened (busy until the kernel released the last
// open) is retried, more slowly each time.
func TestListenerBacksOffAfterFailedOpens(t *testing.T) {
	var opens atomic.Int32
	l := NewPortListener(func() (io.ReadWriteCloser, error) {
		opens.Add(1)
		return nil, unix.EBUSY
	}, Addr{"test", "test"})
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	time.Sleep(800 * time.Millisecond)
	l.Close()
	// Opens at 0, 50, 150, 350 and 750 ms.
	if n := opens.Load(); n > 6 || n < 3 {
		t.Errorf("%d opens in 0.8s, want 3..6", n)
	}
	select {
	case err := <-accepted:
		if err != net.ErrClosed {
			t.Errorf("Accept after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Error("Close did not end Accept")
	}
}

// fakePort is a virtio port: until the host connects, and after it went
// away, reads return 0 bytes (with zeroErr: os.File says io.EOF); while
// it is connected, reads return what it sent and then fail with EAGAIN,
// where a real port would block.
type fakePort struct {
	zeroErr error

	mu        sync.Mutex
	connected bool
	data      []byte
	reads     []time.Time
}

func (p *fakePort) Read(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads = append(p.reads, time.Now())
	if !p.connected {
		return 0, p.zeroErr
	}
	if len(p.data) == 0 {
		return 0, unix.EAGAIN
	}
	n := copy(b, p.data)
	p.data = p.data[n:]
	return n, nil
}

func (p *fakePort) Write(b []byte) (int, error) { return len(b), nil }
func (p *fakePort) Close() error                { return nil }

// connect connects the host, which sends data.
func (p *fakePort) connect(data string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.connected, p.data = true, []byte(data)
}

func (p *fakePort) disconnect() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.connected = false
}

func (p *fakePort) readTimes() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reads)
}

// waitReads waits until p was read n times.
func (p *fakePort) waitReads(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); len(p.readTimes()) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d reads, want %d", len(p.readTimes()), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// acceptFake returns the connection a listener over port hands out, with
// wake as its wake-up source and poll as its fallback.
func acceptFake(t *testing.T, port io.ReadWriteCloser, wake <-chan os.Signal, poll time.Duration) net.Conn {
	t.Helper()
	l := newPortListener(func() (io.ReadWriteCloser, error) { return port, nil }, Addr{"test", "test"}, wake)
	l.poll = poll
	t.Cleanup(func() { l.Close() })
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type readResult struct {
	data string
	err  error
}

func readAsync(c net.Conn) <-chan readResult {
	ch := make(chan readResult, 1)
	go func() {
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		ch <- readResult{string(buf[:n]), err}
	}()
	return ch
}

// A fresh connection whose host is not connected yet waits for it, and
// reads what it sends as soon as the wake-up comes: no EOF, no reopen.
func TestReadWaitsForHost(t *testing.T) {
	for _, zeroErr := range []error{io.EOF, nil} {
		port := &fakePort{zeroErr: zeroErr}
		wake := make(chan os.Signal, 1)
		c := acceptFake(t, port, wake, time.Minute)
		got := readAsync(c)
		port.waitReads(t, 1)
		select {
		case r := <-got:
			t.Fatalf("zero read (%v) returned %q, %v before the host connected", zeroErr, r.data, r.err)
		case <-time.After(50 * time.Millisecond):
		}
		port.connect("hello")
		wake <- unix.SIGIO
		select {
		case r := <-got:
			if r.data != "hello" || r.err != nil {
				t.Errorf("zero read (%v): read %q, %v", zeroErr, r.data, r.err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("zero read (%v): the wake-up did not end the wait", zeroErr)
		}
		if n := len(port.readTimes()); n != 2 {
			t.Errorf("zero read (%v): %d reads, want 2", zeroErr, n)
		}
	}
}

// Once a connection has read data and answered, a 0-byte read means the
// host went away: EOF at once, so that the ttrpc session ends.
func TestReadAfterDataIsEOF(t *testing.T) {
	for _, zeroErr := range []error{io.EOF, nil} {
		port := &fakePort{zeroErr: zeroErr}
		port.connect("x")
		c := acceptFake(t, port, make(chan os.Signal, 1), time.Minute)
		buf := make([]byte, 8)
		if n, err := c.Read(buf); n != 1 || err != nil {
			t.Fatalf("zero read (%v): first read %d, %v", zeroErr, n, err)
		}
		if _, err := c.Write([]byte("y")); err != nil {
			t.Fatal(err)
		}
		port.disconnect()
		start := time.Now()
		select {
		case r := <-readAsync(c):
			if r.data != "" || r.err != io.EOF {
				t.Errorf("zero read (%v): read after the host left: %q, %v; want EOF", zeroErr, r.data, r.err)
			}
			if d := time.Since(start); d >= driverCatchUp {
				t.Errorf("zero read (%v): EOF after %v; an answered connection does not wait for the driver", zeroErr, d)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("zero read (%v): no EOF after the host left", zeroErr)
		}
		c.Close()
	}
}

type unansweredReport struct {
	waited time.Duration
	kept   bool
}

// acceptReporting is acceptFake with the listener's catch-up and its
// reports of unanswered connections recorded.
func acceptReporting(t *testing.T, port io.ReadWriteCloser, catchUp time.Duration) (net.Conn, func() []unansweredReport) {
	t.Helper()
	var mu sync.Mutex
	var reports []unansweredReport
	l := newPortListener(func() (io.ReadWriteCloser, error) { return port, nil }, Addr{"test", "test"}, make(chan os.Signal, 1))
	l.poll, l.catchUp = time.Minute, catchUp
	l.unanswered = func(waited time.Duration, kept bool) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, unansweredReport{waited, kept})
	}
	t.Cleanup(func() { l.Close() })
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return c, func() []unansweredReport {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(reports)
	}
}

// A connection that read the host's request and found the host "gone"
// before it wrote anything waits for the driver to catch up (its connect
// handled after the data): reads again, keeps the session when the host
// is counted again, and reports it; one that answered, or never read,
// does not wait.
func TestUnansweredConnectionWaitsForTheDriver(t *testing.T) {
	port := &fakePort{zeroErr: io.EOF}
	port.connect("ping")
	c, reports := acceptReporting(t, port, time.Minute)
	if n, err := c.Read(make([]byte, 8)); n != 4 || err != nil {
		t.Fatalf("first read %d, %v", n, err)
	}
	port.disconnect()
	got := readAsync(c)
	reads := len(port.readTimes())
	port.waitReads(t, reads+3) // read again, every catchUpStep
	select {
	case r := <-got:
		t.Fatalf("read %q, %v while waiting for the driver; want it to keep waiting", r.data, r.err)
	default:
	}
	port.connect("ping2")
	select {
	case r := <-got:
		if r.data != "ping2" || r.err != nil {
			t.Fatalf("read %q, %v after the driver caught up; want the host's next data", r.data, r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no read after the driver caught up")
	}
	rs := reports()
	if len(rs) != 1 || !rs[0].kept || rs[0].waited < 2*catchUpStep {
		t.Errorf("reports %+v; want one, kept, after ≥ %v", rs, 2*catchUpStep)
	}
}

// A driver that does not catch up within the bound ends the connection
// (EOF, so that the port is opened again and the host connects again),
// reported as not kept.
func TestUnansweredConnectionEndsAfterCatchUp(t *testing.T) {
	const catchUp = 100 * time.Millisecond
	port := &fakePort{zeroErr: io.EOF}
	port.connect("ping")
	c, reports := acceptReporting(t, port, catchUp)
	if n, err := c.Read(make([]byte, 8)); n != 4 || err != nil {
		t.Fatalf("first read %d, %v", n, err)
	}
	port.disconnect()
	start := time.Now()
	if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("read after the host left: %d, %v; want EOF", n, err)
	}
	if d := time.Since(start); d < catchUp {
		t.Errorf("EOF after %v; want it after the catch-up of %v", d, catchUp)
	}
	rs := reports()
	if len(rs) != 1 || rs[0].kept || rs[0].waited < catchUp {
		t.Errorf("reports %+v; want one, not kept, after ≥ %v", rs, catchUp)
	}
}

// Close ends a wait for the driver at once.
func TestCloseEndsCatchUp(t *testing.T) {
	port := &fakePort{zeroErr: io.EOF}
	port.connect("ping")
	c, _ := acceptReporting(t, port, time.Minute)
	if n, err := c.Read(make([]byte, 8)); n != 4 || err != nil {
		t.Fatalf("first read %d, %v", n, err)
	}
	port.disconnect()
	got := readAsync(c)
	port.waitReads(t, len(port.readTimes())+1)
	c.Close()
	select {
	case r := <-got:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Errorf("read after Close: %q, %v; want net.ErrClosed", r.data, r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end the wait for the driver")
	}
}

// virtioInterrupts keeps /proc/interrupts' virtio lines, squeezed.
func TestVirtioInterrupts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "interrupts")
	os.WriteFile(p, []byte("           CPU0       \n  1:          9   IO-APIC   1-edge      i8042\n 24:          0   PCI-MSI 49152-edge      virtio0-config\n 25:        318   PCI-MSI 49153-edge      virtio0-virtqueues\nLOC:       1234   Local timer interrupts\n"), 0o644)
	want := "24: 0 PCI-MSI 49152-edge virtio0-config; 25: 318 PCI-MSI 49153-edge virtio0-virtqueues"
	if got := virtioInterrupts(p); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := virtioInterrupts(filepath.Join(t.TempDir(), "none")); !strings.Contains(got, "no such file") {
		t.Errorf("missing file: got %q", got)
	}
}

// A socket's 0-byte read (vsock, which does not go through a PortListener)
// is the peer's close: EOF even before any data.
func TestSocketConnZeroReadIsEOF(t *testing.T) {
	c := newFileConn(&fakePort{zeroErr: io.EOF}, Addr{"vsock", "test"})
	if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("read %d, %v; want EOF", n, err)
	}
}

// Close ends a Read that waits for the host.
func TestCloseEndsWaitingRead(t *testing.T) {
	port := &fakePort{zeroErr: io.EOF}
	c := acceptFake(t, port, make(chan os.Signal, 1), time.Minute)
	got := readAsync(c)
	port.waitReads(t, 1)
	c.Close()
	select {
	case r := <-got:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Errorf("read after Close: %q, %v", r.data, r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end the Read")
	}
}

// A read deadline ends a wait for the host.
func TestReadDeadlineEndsWait(t *testing.T) {
	port := &fakePort{zeroErr: io.EOF}
	c := acceptFake(t, port, make(chan os.Signal, 1), time.Minute)
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	select {
	case r := <-readAsync(c):
		if !errors.Is(r.err, os.ErrDeadlineExceeded) {
			t.Errorf("read: %q, %v; want the deadline", r.data, r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the read deadline did not end the wait")
	}
}

// Without wake-ups (a lost SIGIO) a waiting connection reads again once
// per fallback interval, never faster.
func TestReadPollsWithoutWake(t *testing.T) {
	if NewPortListener(nil, Addr{}).poll != maxBackoff || maxBackoff != time.Second {
		t.Fatalf("fallback interval is not one second")
	}
	const poll = 100 * time.Millisecond
	port := &fakePort{zeroErr: io.EOF}
	c := acceptFake(t, port, nil, poll)
	got := readAsync(c)
	time.Sleep(550 * time.Millisecond)
	c.Close()
	<-got
	reads := port.readTimes()
	// At 0, 100, ... 500 ms.
	if len(reads) < 4 || len(reads) > 7 {
		t.Errorf("%d reads in 550ms with a %v fallback, want 4..7", len(reads), poll)
	}
	for i := 1; i < len(reads); i++ {
		if gap := reads[i].Sub(reads[i-1]); gap < poll-5*time.Millisecond {
			t.Errorf("read %d came %v after the one before, want at least %v", i, gap, poll)
		}
	}
}

// lateHost is a port over a socket whose host connects when connect is
// closed: until then its reads return 0 bytes, as an unconnected virtio
// port's do.
type lateHost struct {
	*os.File
	connected atomic.Bool
}

func (p *lateHost) Read(b []byte) (int, error) {
	if !p.connected.Load() {
		return 0, io.EOF
	}
	return p.File.Read(b)
}

// The host connects a while after the agent opened the port (a guest
// restored from a template): the wake-up makes the waiting connection
// serve it at once, on the same open.
func TestListenerServesLateHost(t *testing.T) {
	guest, host := socketpair(t)
	port := &lateHost{File: guest}
	var opens atomic.Int32
	wake := make(chan os.Signal, 1)
	l := newPortListener(func() (io.ReadWriteCloser, error) {
		opens.Add(1)
		return port, nil
	}, Addr{"test", "test"}, wake)
	l.poll = time.Minute
	servePing(t, l)

	conn, err := net.FileConn(host)
	host.Close()
	if err != nil {
		t.Fatal(err)
	}
	client := ttrpc.NewClient(conn)
	defer client.Close()
	time.Sleep(200 * time.Millisecond) // the agent waits on its port
	port.connected.Store(true)
	wake <- unix.SIGIO
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := agent.NewAgentClient(client).Ping(ctx, &agent.PingRequest{})
	if err != nil || resp.AgentVersion != "test" {
		t.Fatalf("ping: %v %v", resp, err)
	}
	if n := opens.Load(); n != 1 {
		t.Errorf("%d opens, want 1", n)
	}
}

// ListenPort's opens ask for SIGIO (O_ASYNC, owned by this process, still
// O_NONBLOCK), and the signal reaches the listener's wake-up channel. A
// FIFO stands in for the port: it signals when data arrives.
func TestListenPortAsksForSIGIO(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "port")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	l := ListenPort(fifo)
	defer l.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	// Not f.Fd(), which would make the file blocking.
	sc, err := c.(*fileConn).rwc.(*os.File).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var flags, owner int
	var flagsErr, ownerErr error
	sc.Control(func(fd uintptr) {
		flags, flagsErr = unix.FcntlInt(fd, unix.F_GETFL, 0)
		owner, ownerErr = unix.FcntlInt(fd, unix.F_GETOWN, 0)
	})
	if flagsErr != nil || flags&unix.O_ASYNC == 0 || flags&unix.O_NONBLOCK == 0 {
		t.Errorf("flags %#o (%v) lack O_ASYNC or O_NONBLOCK", flags, flagsErr)
	}
	if ownerErr != nil || owner != os.Getpid() {
		t.Errorf("owner %d, %v; want %d", owner, ownerErr, os.Getpid())
	}
	// Drain a notification that came before the write.
	select {
	case <-l.wake:
	default:
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.wake:
	case <-time.After(2 * time.Second):
		t.Fatal("no SIGIO reached the listener")
	}
	buf := make([]byte, 4)
	if n, err := c.Read(buf); n != 1 || err != nil {
		t.Errorf("read %d, %v", n, err)
	}
	// Connected: the port stops signalling, so that the host's writes do
	// not interrupt the agent's system calls (a BPF load gave up with
	// EAGAIN under them).
	sc.Control(func(fd uintptr) { flags, flagsErr = unix.FcntlInt(fd, unix.F_GETFL, 0) })
	if flagsErr != nil || flags&unix.O_ASYNC != 0 {
		t.Errorf("flags %#o (%v) after the first read still hold O_ASYNC", flags, flagsErr)
	}
	// The FIFO, open for writing too, signalled the read itself (before
	// O_ASYNC was cleared): let that one arrive first.
	select {
	case <-l.wake:
	case <-time.After(200 * time.Millisecond):
	}
	if _, err := w.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.wake:
		t.Errorf("a SIGIO for a write after the connection was established")
	case <-time.After(200 * time.Millisecond):
	}
}

type pingService struct{ agent.AgentService }

// servePing serves the agent API's Ping on l until the test ends.
func servePing(t *testing.T, l net.Listener) {
	t.Helper()
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	agent.RegisterAgentService(srv, pingService{})
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() { srv.Close() })
}

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
	servePing(t, l)

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
