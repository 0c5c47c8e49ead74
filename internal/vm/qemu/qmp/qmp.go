// Package qmp is a client for the QEMU Machine Protocol.
//
// A Client owns one connection and one reader goroutine. The reader
// matches replies to commands by the "id" member the client sends, and
// hands asynchronous events to watchers and to the Events channel. Every
// command takes a context: when it ends, the command returns and its late
// reply, if any, is dropped.
//
// Events are delivered to a Watcher that was registered before the
// command that triggers them is sent, so an event such as DEVICE_DELETED
// or SHUTDOWN cannot slip between the command and the wait:
//
//	w := c.Watch(qmp.EventNamed("DEVICE_DELETED"))
//	defer w.Stop()
//	if err := c.Execute(ctx, "device_del", map[string]string{"id": id}, nil); err != nil { ... }
//	ev, err := w.Wait(ctx)
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Error is an error reply from QEMU ({"error": {"class": ..., "desc": ...}}).
// Callers branch on it with errors.As.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string {
	return "qmp error " + e.Class + ": " + e.Desc
}

// ErrClosed is returned (wrapped together with the cause, io.EOF or
// net.ErrClosed) by every call made after the connection ended.
var ErrClosed = errors.New("qmp connection closed")

// Event is an asynchronous QMP event.
type Event struct {
	Name string
	Data json.RawMessage
	Time time.Time
}

// MaxMessage bounds one message from QEMU: QMP sends each as one line of
// JSON, and the replies and events Hull asks for are a few KiB at most.
// QEMU runs the guest's devices, so a guest that took it over could
// otherwise make the shim buffer a message without end.
const MaxMessage = 1 << 20

// ErrMessageTooLong ends a connection on which QEMU sent a line longer
// than MaxMessage bytes.
var ErrMessageTooLong = fmt.Errorf("qmp message longer than %d bytes", MaxMessage)

// lineLimitReader is r, failing with ErrMessageTooLong once a line (the
// bytes between two newlines) passes max bytes.
type lineLimitReader struct {
	r   io.Reader
	max int
	n   int // bytes of the current line read so far
}

func (l *lineLimitReader) Read(p []byte) (int, error) {
	k, err := l.r.Read(p)
	for b := p[:k]; ; {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			l.n += len(b)
			break
		}
		if l.n+i > l.max {
			return 0, ErrMessageTooLong
		}
		l.n, b = 0, b[i+1:]
	}
	if l.n > l.max {
		return 0, ErrMessageTooLong
	}
	return k, err
}

// Version is QEMU's version as reported in the QMP greeting.
type Version struct {
	Qemu struct {
		Major int `json:"major"`
		Minor int `json:"minor"`
		Micro int `json:"micro"`
	} `json:"qemu"`
	Package string `json:"package"`
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Qemu.Major, v.Qemu.Minor, v.Qemu.Micro)
}

// EventsBuffer is the capacity of the channel returned by Events. When it
// is full, further events are dropped from that channel (never from
// watchers) and counted.
const EventsBuffer = 64

// message is any object QEMU sends after the greeting.
type message struct {
	ID        json.RawMessage `json:"id"`
	Return    json.RawMessage `json:"return"`
	Error     *Error          `json:"error"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

type command struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
	ID        string `json:"id"`
}

type reply struct {
	ret json.RawMessage
	err *Error
}

// Client is a QMP connection. It is safe for concurrent use.
type Client struct {
	conn    net.Conn
	dec     *json.Decoder
	log     *slog.Logger
	version Version
	events  chan Event

	// writeMu serialises writes, so a command and the descriptor sent
	// with it stay together on the wire.
	writeMu sync.Mutex

	// mu guards the fields below.
	mu       sync.Mutex
	nextID   uint64
	pending  map[string]chan reply
	watchers map[*Watcher]struct{}
	err      error // why the connection ended; nil while it is up
	dropped  uint64

	closeOnce  sync.Once
	readerDone chan struct{} // closed when the reader has exited and err is set
}

// Dial connects to the QMP unix socket at path and negotiates
// capabilities. ctx bounds the dial and the handshake only.
func Dial(ctx context.Context, path string, logger *slog.Logger) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dialing qmp %s: %w", path, err)
	}
	c, err := New(ctx, conn, logger)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// New runs the QMP handshake on conn (greeting, qmp_capabilities) and
// starts the reader. On error conn is closed. ctx bounds the handshake.
func New(ctx context.Context, conn net.Conn, logger *slog.Logger) (*Client, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		conn:       conn,
		dec:        json.NewDecoder(bufio.NewReader(&lineLimitReader{r: conn, max: MaxMessage})),
		log:        logger,
		events:     make(chan Event, EventsBuffer),
		pending:    make(map[string]chan reply),
		watchers:   make(map[*Watcher]struct{}),
		readerDone: make(chan struct{}),
	}
	if err := c.handshake(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	go c.read()
	return c, nil
}

// handshake runs before the reader starts, so it reads and writes the
// connection directly. QEMU sends no event before capabilities are
// negotiated.
func (c *Client) handshake(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if dl, ok := ctx.Deadline(); ok {
		c.conn.SetDeadline(dl)
	}
	var greeting struct {
		QMP *struct {
			Version      Version  `json:"version"`
			Capabilities []string `json:"capabilities"`
		} `json:"QMP"`
	}
	if err := c.dec.Decode(&greeting); err != nil {
		return fmt.Errorf("reading greeting: %w", ctxErr(ctx, err))
	}
	if greeting.QMP == nil {
		return errors.New("reading greeting: no QMP member")
	}
	c.version = greeting.QMP.Version
	b, _ := json.Marshal(command{Execute: "qmp_capabilities", ID: "hull-0"})
	if _, err := c.conn.Write(b); err != nil {
		return fmt.Errorf("sending qmp_capabilities: %w", ctxErr(ctx, err))
	}
	var m message
	if err := c.dec.Decode(&m); err != nil {
		return fmt.Errorf("reading qmp_capabilities reply: %w", ctxErr(ctx, err))
	}
	if m.Error != nil {
		return fmt.Errorf("qmp_capabilities: %w", m.Error)
	}
	if !stop() {
		// ctx ended meanwhile; its deadline may be set on the conn.
		return fmt.Errorf("qmp_capabilities: %w", ctx.Err())
	}
	c.conn.SetDeadline(time.Time{})
	return nil
}

// ctxErr prefers the context's error to the deadline error it provoked.
// Only ctx sets deadlines on the connection, so a deadline error means
// ctx is ending (its timer may fire a moment after the connection's).
func ctxErr(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		<-ctx.Done()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// Version is QEMU's version from the greeting.
func (c *Client) Version() Version { return c.version }

// Events returns a channel carrying every event, closed when the
// connection ends. It is buffered (EventsBuffer); events that do not fit
// are dropped from it. Use a Watcher for events that must not be missed.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when the connection has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.readerDone }

// Err is nil while the connection is up, else why it ended.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection, fails pending commands and waits for the
// reader to exit. It is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { c.conn.Close() })
	<-c.readerDone
	return nil
}

func (c *Client) read() {
	var err error
	for {
		var m message
		if err = c.dec.Decode(&m); err != nil {
			break
		}
		c.dispatch(&m)
	}
	// Whatever ended the stream (EOF, our Close, a reset, garbage), it is
	// unusable now: close it so that writers fail fast too.
	c.closeOnce.Do(func() { c.conn.Close() })
	if errors.Is(err, ErrMessageTooLong) {
		c.log.Warn("qemu sent a qmp message past the bound: the connection is closed, the VM can only be stopped", "error", err)
	}
	err = fmt.Errorf("%w: %w", ErrClosed, err)
	c.mu.Lock()
	c.err = err
	c.pending = nil // waiters select on readerDone
	watchers := c.watchers
	c.watchers = nil
	c.mu.Unlock()
	for w := range watchers {
		w.fail(err)
	}
	close(c.events)
	close(c.readerDone)
}

func (c *Client) dispatch(m *message) {
	if m.Event != "" {
		ev := Event{Name: m.Event, Data: m.Data}
		if m.Timestamp != nil {
			ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
		}
		c.log.Debug("qmp event", "event", ev.Name, "data", string(ev.Data))
		c.mu.Lock()
		for w := range c.watchers {
			if w.match(ev) {
				w.deliver(ev)
				delete(c.watchers, w)
			}
		}
		select {
		case c.events <- ev:
		default:
			c.dropped++
		}
		c.mu.Unlock()
		return
	}
	var id string
	if len(m.ID) == 0 || json.Unmarshal(m.ID, &id) != nil {
		c.log.Warn("qmp reply without a known id dropped", "id", string(m.ID), "error", m.Error)
		return
	}
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if !ok {
		// The command's context ended before the reply came.
		c.log.Debug("late qmp reply dropped", "id", id)
		return
	}
	ch <- reply{ret: m.Return, err: m.Error} // buffered, never blocks
}

// Execute runs cmd with args (marshalled to JSON; nil for none) and
// unmarshals the reply's "return" member into result unless it is nil.
// An error reply is returned as a wrapped *Error.
func (c *Client) Execute(ctx context.Context, cmd string, args any, result any) error {
	return c.execute(ctx, cmd, args, result, -1)
}

func (c *Client) execute(ctx context.Context, cmd string, args any, result any, fd int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	c.nextID++
	id := "hull-" + strconv.FormatUint(c.nextID, 10)
	ch := make(chan reply, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
	}

	b, err := json.Marshal(command{Execute: cmd, Arguments: args, ID: id})
	if err != nil {
		forget()
		return fmt.Errorf("qmp %s: encoding arguments: %w", cmd, err)
	}
	if err := c.write(ctx, b, fd); err != nil {
		forget()
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}

	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("qmp %s: %w", cmd, r.err)
		}
		if result != nil {
			if err := json.Unmarshal(r.ret, result); err != nil {
				return fmt.Errorf("qmp %s: decoding reply: %w", cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	case <-c.readerDone:
		// The reply may have been dispatched just before the end.
		select {
		case r := <-ch:
			if r.err != nil {
				return fmt.Errorf("qmp %s: %w", cmd, r.err)
			}
			if result != nil {
				if err := json.Unmarshal(r.ret, result); err != nil {
					return fmt.Errorf("qmp %s: decoding reply: %w", cmd, err)
				}
			}
			return nil
		default:
		}
		return fmt.Errorf("qmp %s: %w", cmd, c.Err())
	}
}

// write sends one command, with fd attached (SCM_RIGHTS) when fd >= 0.
// ctx bounds the write; a write cut short mid-message leaves the stream
// unusable, so the connection is then closed.
func (c *Client) write(ctx context.Context, b []byte, fd int) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()

	dl, _ := ctx.Deadline()
	c.conn.SetWriteDeadline(dl)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.conn.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired // don't let it touch the next writer's deadline
		}
	}()

	var n int
	var err error
	if fd >= 0 {
		uc, ok := c.conn.(*net.UnixConn)
		if !ok {
			return errors.New("passing a descriptor needs a unix socket connection")
		}
		n, _, err = uc.WriteMsgUnix(b, unix.UnixRights(fd), nil)
	} else {
		n, err = c.conn.Write(b)
	}
	if err != nil {
		if n > 0 {
			c.closeOnce.Do(func() { c.conn.Close() })
		}
		if err := ctxErr(ctx, err); ctx.Err() != nil {
			return err
		}
		if errors.Is(err, net.ErrClosed) {
			// Closed on our side (Close, or QEMU's exit reaped): the
			// reader is ending and records why; report that.
			<-c.readerDone
		}
		c.mu.Lock()
		cerr := c.err
		c.mu.Unlock()
		if cerr != nil {
			return cerr
		}
		return fmt.Errorf("writing: %w", err)
	}
	return nil
}

// SendFD passes fd to QEMU with SCM_RIGHTS and names it with getfd, for
// commands that take a descriptor name (netdev tap fd=..., etc.). The
// caller keeps its own copy of fd and may close it once SendFD returns.
func (c *Client) SendFD(ctx context.Context, fd int, name string) error {
	return c.execute(ctx, "getfd", map[string]string{"fdname": name}, nil, fd)
}

// FDInfo is the reply of add-fd: the descriptor lives in QEMU as
// /dev/fdset/<FDSetID>.
type FDInfo struct {
	FDSetID int `json:"fdset-id"`
	FD      int `json:"fd"`
}

// AddFD passes fd to QEMU with SCM_RIGHTS and adds it to a descriptor
// set (add-fd): to fdsetID when it is >= 0, else to a new set that QEMU
// numbers. opaque is a free-form note stored with it (may be empty).
// Block devices then open "/dev/fdset/<FDSetID>".
func (c *Client) AddFD(ctx context.Context, fd int, fdsetID int, opaque string) (FDInfo, error) {
	args := map[string]any{}
	if fdsetID >= 0 {
		args["fdset-id"] = fdsetID
	}
	if opaque != "" {
		args["opaque"] = opaque
	}
	var info FDInfo
	if err := c.execute(ctx, "add-fd", args, &info, fd); err != nil {
		return FDInfo{}, err
	}
	return info, nil
}

// Watcher receives the first event that matches its predicate. Register
// it (Client.Watch) before sending the command that triggers the event.
type Watcher struct {
	c     *Client
	match func(Event) bool
	ch    chan Event // buffered 1; receives the matching event
	errCh chan error // buffered 1; receives why the connection ended
}

// Watch registers a watcher for the first event for which match returns
// true. match runs on the reader goroutine and must not block. Call Stop
// when the event is no longer wanted.
func (c *Client) Watch(match func(Event) bool) *Watcher {
	w := &Watcher{c: c, match: match, ch: make(chan Event, 1), errCh: make(chan error, 1)}
	c.mu.Lock()
	if c.err != nil {
		w.errCh <- c.err
	} else {
		c.watchers[w] = struct{}{}
	}
	c.mu.Unlock()
	return w
}

func (w *Watcher) deliver(ev Event) { w.ch <- ev }
func (w *Watcher) fail(err error)   { w.errCh <- err }

// Wait returns the matching event, or an error when ctx ends or the
// connection ends first. An event that arrived before Wait is kept.
func (w *Watcher) Wait(ctx context.Context) (Event, error) {
	select {
	case ev := <-w.ch:
		return ev, nil
	default:
	}
	select {
	case ev := <-w.ch:
		return ev, nil
	case err := <-w.errCh:
		return Event{}, fmt.Errorf("waiting for event: %w", err)
	case <-ctx.Done():
		return Event{}, fmt.Errorf("waiting for event: %w", ctx.Err())
	}
}

// Stop unregisters the watcher. It is idempotent.
func (w *Watcher) Stop() {
	w.c.mu.Lock()
	if w.c.watchers != nil {
		delete(w.c.watchers, w)
	}
	w.c.mu.Unlock()
}

// WaitEvent waits for the first event matching match that arrives after
// the call. To catch an event triggered by a command, use Watch before
// sending the command instead.
func (c *Client) WaitEvent(ctx context.Context, match func(Event) bool) (Event, error) {
	w := c.Watch(match)
	defer w.Stop()
	return w.Wait(ctx)
}

// EventNamed matches events by name, e.g. EventNamed("SHUTDOWN").
func EventNamed(name string) func(Event) bool {
	return func(ev Event) bool { return ev.Name == name }
}

// DeviceDeleted matches the DEVICE_DELETED event of the device with the
// given id.
func DeviceDeleted(id string) func(Event) bool {
	return func(ev Event) bool {
		if ev.Name != "DEVICE_DELETED" {
			return false
		}
		var d struct {
			Device string `json:"device"`
		}
		return json.Unmarshal(ev.Data, &d) == nil && d.Device == id
	}
}
