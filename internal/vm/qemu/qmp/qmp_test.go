package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeServer is the QEMU side of one QMP connection.
type fakeServer struct {
	t    *testing.T
	conn *net.UnixConn
	dec  *json.Decoder
}

type cmdIn struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

func (s *fakeServer) send(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.t.Errorf("fake server: %v", err)
		return
	}
	if _, err := s.conn.Write(append(b, '\r', '\n')); err != nil {
		s.t.Errorf("fake server write: %v", err)
	}
}

func (s *fakeServer) recv() cmdIn {
	var c cmdIn
	if err := s.dec.Decode(&c); err != nil {
		s.t.Errorf("fake server read: %v", err)
	}
	return c
}

// waitClose blocks until the client closes the connection.
func (s *fakeServer) waitClose() {
	var v any
	for s.dec.Decode(&v) == nil {
	}
}

func (s *fakeServer) reply(c cmdIn, ret any) {
	s.send(map[string]any{"return": ret, "id": c.ID})
}

func (s *fakeServer) event(name string, data any) {
	s.send(map[string]any{"event": name, "data": data,
		"timestamp": map[string]int64{"seconds": 1700000000, "microseconds": 5}})
}

// handshake plays the server's part of the QMP handshake.
func (s *fakeServer) handshake() {
	s.send(map[string]any{"QMP": map[string]any{
		"version":      map[string]any{"qemu": map[string]int{"major": 7, "minor": 2, "micro": 22}, "package": "Debian"},
		"capabilities": []string{"oob"},
	}})
	c := s.recv()
	if c.Execute != "qmp_capabilities" {
		s.t.Errorf("first command %q, want qmp_capabilities", c.Execute)
	}
	s.reply(c, map[string]any{})
}

// setup starts a fake server on a unix socket, runs serve on the accepted
// connection, and returns a connected client. serve must perform the
// handshake first.
func setup(t *testing.T, serve func(s *fakeServer)) *Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := l.AcceptUnix()
		l.Close()
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer conn.Close()
		serve(&fakeServer{t: t, conn: conn, dec: json.NewDecoder(conn)})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		wg.Wait()
	})
	return c
}

func ctx5s(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestHandshakeAndExecute(t *testing.T) {
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		cmd := s.recv()
		if cmd.Execute != "query-status" {
			t.Errorf("got %q", cmd.Execute)
		}
		s.reply(cmd, map[string]any{"status": "running", "running": true})
		s.waitClose()
	})
	if got := c.Version().String(); got != "7.2.22" {
		t.Errorf("version %q", got)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := c.Execute(ctx5s(t), "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "running" {
		t.Errorf("status %q", st.Status)
	}
}

func TestRepliesOutOfOrderAndEventsInterleaved(t *testing.T) {
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		a, b := s.recv(), s.recv()
		s.event("RESUME", map[string]any{})
		s.reply(b, b.Execute)
		s.event("STOP", map[string]any{})
		s.reply(a, a.Execute)
		s.waitClose()
	})
	var wg sync.WaitGroup
	for _, name := range []string{"cmd-a", "cmd-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got string
			if err := c.Execute(ctx5s(t), name, nil, &got); err != nil {
				t.Error(err)
			}
			if got != name {
				t.Errorf("reply to %s is %q", name, got)
			}
		}()
		time.Sleep(10 * time.Millisecond) // a before b on the wire
	}
	wg.Wait()
	for _, want := range []string{"RESUME", "STOP"} {
		select {
		case ev := <-c.Events():
			if ev.Name != want {
				t.Errorf("event %q, want %q", ev.Name, want)
			}
			if ev.Time.Unix() != 1700000000 {
				t.Errorf("event time %v", ev.Time)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s event", want)
		}
	}
}

func TestWatcherBeforeCommandSeesEvent(t *testing.T) {
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		cmd := s.recv()
		// QEMU may emit the event before the command's reply.
		s.event("DEVICE_DELETED", map[string]string{"device": "other"})
		s.event("DEVICE_DELETED", map[string]string{"device": "disk1", "path": "/machine/peripheral/disk1"})
		s.reply(cmd, map[string]any{})
		s.waitClose()
	})
	w := c.Watch(DeviceDeleted("disk1"))
	defer w.Stop()
	if err := c.Execute(ctx5s(t), "device_del", map[string]string{"id": "disk1"}, nil); err != nil {
		t.Fatal(err)
	}
	ev, err := w.Wait(ctx5s(t))
	if err != nil {
		t.Fatal(err)
	}
	var d struct{ Device string }
	json.Unmarshal(ev.Data, &d)
	if d.Device != "disk1" {
		t.Errorf("got event for %q", d.Device)
	}
}

func TestQMPErrorIsTyped(t *testing.T) {
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		cmd := s.recv()
		s.send(map[string]any{"id": cmd.ID, "error": map[string]string{
			"class": "DeviceNotFound", "desc": "Device 'nope' not found"}})
		s.waitClose()
	})
	err := c.Execute(ctx5s(t), "device_del", map[string]string{"id": "nope"}, nil)
	var qe *Error
	if !errors.As(err, &qe) {
		t.Fatalf("error %v is not a *qmp.Error", err)
	}
	if qe.Class != "DeviceNotFound" || qe.Desc != "Device 'nope' not found" {
		t.Errorf("got %+v", qe)
	}
}

func TestContextTimeoutDropsLateReply(t *testing.T) {
	before := runtime.NumGoroutine()
	lateSent := make(chan struct{})
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		slow := s.recv()
		next := s.recv()
		s.reply(slow, "late") // after the client gave up on it
		close(lateSent)
		s.reply(next, "next")
		s.waitClose()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Execute(ctx, "slow", nil, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want a deadline error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("deadline honoured after %v", d)
	}
	var got string
	if err := c.Execute(ctx5s(t), "next", nil, &got); err != nil {
		t.Fatal(err)
	}
	<-lateSent
	if got != "next" {
		t.Errorf("next command got %q (the late reply leaked into it?)", got)
	}
	c.Close()
	// The reader and the fake server's goroutine are gone after Close.
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+1 { // +1: the server goroutine may still be unwinding
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCancelledContextBeforeReply(t *testing.T) {
	got := make(chan struct{})
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		cmd := s.recv()
		close(got)
		s.waitClose() // never answered
		_ = cmd
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-got; cancel() }()
	if err := c.Execute(ctx, "stuck", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
}

func TestServerClosesMidCommand(t *testing.T) {
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		s.recv()
		s.recv()
		// Close with both commands pending.
	})
	w := c.Watch(EventNamed("SHUTDOWN"))
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() { errs <- c.Execute(context.Background(), "quit", nil, nil) }()
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-errs:
			if !errors.Is(err, io.EOF) || !errors.Is(err, ErrClosed) {
				t.Errorf("got %v, want an error wrapping io.EOF and ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("pending command hangs after the server closed")
		}
	}
	if _, err := w.Wait(ctx5s(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("watcher got %v", err)
	}
	if err := c.Execute(ctx5s(t), "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("command after close: %v", err)
	}
	if _, ok := <-c.Events(); ok {
		t.Error("events channel not closed")
	}
}

func TestCloseIsIdempotentAndFailsCalls(t *testing.T) {
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		var v any
		s.dec.Decode(&v) // returns when the client closes
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	err := c.Execute(ctx5s(t), "query-status", nil, nil)
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("got %v, want net.ErrClosed", err)
	}
}

// A command that races Close (as a stop request races QEMU's reaped exit)
// fails with ErrClosed, never with a bare write error.
func TestCommandRacingCloseFailsWithErrClosed(t *testing.T) {
	for i := 0; i < 20; i++ {
		c := setup(t, func(s *fakeServer) {
			s.handshake()
			for { // answer every command at once, until the client closes
				var in cmdIn
				if s.dec.Decode(&in) != nil {
					return
				}
				// Not s.reply: the client may be gone by now.
				b, _ := json.Marshal(map[string]any{"return": map[string]any{}, "id": in.ID})
				if _, err := s.conn.Write(append(b, '\r', '\n')); err != nil {
					return
				}
			}
		})
		done := make(chan error, 1)
		go func() {
			for {
				if err := c.Execute(ctx5s(t), "query-status", nil, nil); err != nil {
					done <- err
					return
				}
			}
		}()
		c.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("round %d: got %v, want ErrClosed", i, err)
		}
	}
}

func TestHandshakeHonoursContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err == nil {
			defer conn.Close()
			io.Copy(io.Discard, conn) // never greets
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, path, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
}

// TestPassFD sends a descriptor over a real unix socket and checks that
// the server receives a working copy of it with the command.
func TestPassFD(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "disk"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	recvFD := func(s *fakeServer) (cmdIn, int) {
		buf := make([]byte, 4096)
		oob := make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Errorf("read: %v", err)
			return cmdIn{}, -1
		}
		var c cmdIn
		if err := json.Unmarshal(buf[:n], &c); err != nil {
			t.Errorf("decode %q: %v", buf[:n], err)
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			t.Errorf("control messages %v, %v", msgs, err)
			return c, -1
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			t.Errorf("rights %v, %v", fds, err)
			return c, -1
		}
		return c, fds[0]
	}

	c := setup(t, func(s *fakeServer) {
		s.handshake()
		// The handshake used a buffered decoder; nothing is buffered
		// past it because the client sends nothing unasked.
		cmd, fd := recvFD(s)
		if cmd.Execute != "getfd" || string(cmd.Arguments) != `{"fdname":"tap0"}` {
			t.Errorf("got %s %s", cmd.Execute, cmd.Arguments)
		}
		if fd >= 0 {
			unix.Write(fd, []byte("via getfd;"))
			unix.Close(fd)
		}
		s.reply(cmd, map[string]any{})

		cmd, fd = recvFD(s)
		if cmd.Execute != "add-fd" || string(cmd.Arguments) != `{"fdset-id":3,"opaque":"disk vda"}` {
			t.Errorf("got %s %s", cmd.Execute, cmd.Arguments)
		}
		if fd >= 0 {
			unix.Write(fd, []byte("via add-fd"))
			unix.Close(fd)
		}
		s.reply(cmd, map[string]int{"fdset-id": 3, "fd": 42})
		s.waitClose()
	})

	if err := c.SendFD(ctx5s(t), int(f.Fd()), "tap0"); err != nil {
		t.Fatal(err)
	}
	info, err := c.AddFD(ctx5s(t), int(f.Fd()), 3, "disk vda")
	if err != nil {
		t.Fatal(err)
	}
	if info != (FDInfo{FDSetID: 3, FD: 42}) {
		t.Errorf("got %+v", info)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "via getfd;via add-fd" {
		t.Errorf("file holds %q", b)
	}
}

func TestSendFDNeedsUnixConn(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		s := &fakeServer{t: t, dec: json.NewDecoder(b)}
		enc := json.NewEncoder(b)
		enc.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{}, "capabilities": []string{}}})
		var c cmdIn
		s.dec.Decode(&c)
		enc.Encode(map[string]any{"return": map[string]any{}, "id": c.ID})
		io.Copy(io.Discard, b)
	}()
	c, err := New(ctx5s(t), a, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SendFD(ctx5s(t), 0, "x"); err == nil {
		t.Fatal("SendFD over a pipe succeeded")
	}
}

// A QEMU the guest has taken over may send a message without end: the
// client reads at most MaxMessage bytes of one, then ends the connection
// with an error that says so, instead of buffering what it is sent.
func TestEndlessMessageEndsTheConnection(t *testing.T) {
	sent := make(chan int64, 1)
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		// An event whose data never ends: 64 MiB of one string, no
		// newline, stopped by the client closing.
		chunk := []byte(strings.Repeat("a", 64<<10))
		n, _ := s.conn.Write([]byte(`{"event": "X", "data": {"s": "`))
		total := int64(n)
		for total < 64<<20 {
			n, err := s.conn.Write(chunk)
			total += int64(n)
			if err != nil {
				break
			}
		}
		sent <- total
	})
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the client still reads a message past MaxMessage")
	}
	if err := c.Err(); !errors.Is(err, ErrClosed) || !errors.Is(err, ErrMessageTooLong) {
		t.Errorf("Err() = %v, want ErrClosed and ErrMessageTooLong", err)
	}
	if total := <-sent; total >= 64<<20 {
		t.Errorf("the server wrote all of its %d bytes: the client read them", total)
	}
	if err := c.Execute(ctx5s(t), "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("command after the connection ended: %v", err)
	}
}

// A large message within the bound, and the messages after it, are read
// as any other.
func TestLargeMessageWithinTheBound(t *testing.T) {
	big := strings.Repeat("b", MaxMessage-1024)
	c := setup(t, func(s *fakeServer) {
		s.handshake()
		cmd := s.recv()
		s.reply(cmd, map[string]any{"s": big})
		cmd = s.recv()
		s.reply(cmd, map[string]any{"s": "small"})
		s.waitClose()
	})
	for _, want := range []string{big, "small"} {
		var got struct{ S string }
		if err := c.Execute(ctx5s(t), "query-x", nil, &got); err != nil {
			t.Fatal(err)
		}
		if got.S != want {
			t.Errorf("reply of %d bytes, want %d", len(got.S), len(want))
		}
	}
}

func TestLineLimitReader(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		fail bool
	}{
		{"abc\r\ndef\r\n", 5, false},
		{"abcdef\r\n", 5, true},
		{"abc\r\nabcdef", 5, true},
		{"abcd\nabcd\nabcd\n", 5, false},
		{"", 5, false},
	} {
		r := &lineLimitReader{r: strings.NewReader(tc.in), max: tc.max}
		// One byte at a time and in one read: the bound is the same.
		for _, buf := range []int{1, 64} {
			r.r, r.n = strings.NewReader(tc.in), 0
			var err error
			for err == nil {
				_, err = r.Read(make([]byte, buf))
			}
			if got := errors.Is(err, ErrMessageTooLong); got != tc.fail {
				t.Errorf("%q, max %d, reads of %d: %v, want too long %v", tc.in, tc.max, buf, err, tc.fail)
			}
		}
	}
}
