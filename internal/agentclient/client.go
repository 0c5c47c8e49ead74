// Package agentclient is the host side of the agent channel: it dials the
// socket QEMU exposes for the guest agent and speaks api/agent/v1 over ttrpc.
package agentclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// Client is a connection to one guest agent.
type Client struct {
	agent.AgentService
	conn  net.Conn
	ttrpc *ttrpc.Client
}

// ErrVMExited is returned by Dial when the VM exits before its agent
// answered.
var ErrVMExited = errors.New("the VM exited before its agent answered")

// Dial connects to the agent socket and waits until the agent answers a
// Ping, bounded by ctx, and gives up at once when vmDone closes (the VM
// exited; nil means no such signal). QEMU creates the socket before the
// guest runs, so the connect itself succeeds at once; the Ping is
// answered when the agent has opened its end of the channel.
func Dial(ctx context.Context, socket string, vmDone <-chan struct{}) (*Client, *agent.PingResponse, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if vmDone != nil {
		go func() {
			select {
			case <-vmDone:
				cancel(ErrVMExited)
			case <-ctx.Done():
			}
		}()
	}
	c, ping, err := dial(ctx, socket)
	if errors.Is(err, errConnect) && vmDone != nil {
		// QEMU listens on the socket from its start to its exit, so a
		// refused connect means that it is exiting (a clone whose guest
		// reset at once): wait for the exit, bounded by ctx, and report
		// that rather than the refusal.
		<-ctx.Done()
	}
	if err != nil && errors.Is(context.Cause(ctx), ErrVMExited) {
		return nil, nil, ErrVMExited
	}
	return c, ping, err
}

// PortWatch starts watching the guest open (open) or close (!open) its
// end of the agent channel: seen is closed when it does; stop ends the
// watch.
type PortWatch func(open bool) (seen <-chan struct{}, stop func())

// maxDials bounds DialWatching's connections.
const maxDials = 3

// reopenWait bounds DialWatching's wait for the guest to open its port
// again (the agent reopens it within about a second).
const reopenWait = 3 * time.Second

// ErrPortClosed is returned by DialWatching when the guest closed its end
// of the channel before its agent answered, on every connection.
var ErrPortClosed = errors.New("the guest closed its end of the agent channel before its agent answered")

// DialWatching is Dial that connects again, up to maxDials times in all,
// when the guest closes its end of the channel before its agent answered
// (watch reports it; retried says so). A VM restored from a template
// does this when the notification of the host's connect does not reach
// its virtio-serial driver (seen in one of 10-20 clones restored at once
// under load): the agent takes the host's Ping but cannot answer, ends
// the session and opens its port again, and the Ping is lost. The next
// connection is made once the guest has opened its port again, as a
// first connection meets a waiting agent: connected while the port was
// closed, its notification and Ping could be lost the same way.
//
// QEMU reports a port's changes at most once a second (the last of the
// second), so a guest that closes its port and opens it again within a
// second shows only as "open". The first connection watches for "closed"
// alone (a booting guest opens its port while the host waits; a clone's
// QEMU reports its port open at restore); a later one, made to a port
// reported open again, takes either report as the port having cycled.
func DialWatching(ctx context.Context, socket string, vmDone <-chan struct{}, watch PortWatch, retried func(attempt int, err error)) (*Client, *agent.PingResponse, error) {
	for attempt := 1; ; attempt++ {
		closed, stopClosed := watch(false)
		opened, stopOpened := watch(true)
		var cycled <-chan struct{} // nil: never
		if attempt > 1 {
			cycled = opened
		}
		dctx, cancel := context.WithCancelCause(ctx)
		go func() {
			select {
			case <-closed:
				cancel(ErrPortClosed)
			case <-cycled:
				cancel(ErrPortClosed)
			case <-dctx.Done():
			}
		}()
		c, ping, err := Dial(dctx, socket, vmDone)
		stopClosed()
		portClosed := errors.Is(context.Cause(dctx), ErrPortClosed)
		cancel(nil)
		if err == nil || !portClosed || attempt == maxDials || ctx.Err() != nil {
			stopOpened()
			if err != nil && portClosed {
				err = fmt.Errorf("%w (%d connections)", ErrPortClosed, attempt)
			}
			return c, ping, err
		}
		if retried != nil {
			retried(attempt, ErrPortClosed)
		}
		t := time.NewTimer(reopenWait)
		select {
		case <-opened:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		stopOpened()
	}
}

// errConnect marks a dial whose connect to the agent socket failed.
var errConnect = errors.New("connecting to agent socket")

func dial(ctx context.Context, socket string) (*Client, *agent.PingResponse, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, nil, fmt.Errorf("%w %s: %w", errConnect, socket, err)
	}
	tc := ttrpc.NewClient(conn)
	c := &Client{AgentService: agent.NewAgentClient(tc), conn: conn, ttrpc: tc}
	// The virtio-serial port buffers what we send until the guest opens
	// it, so a single Ping waits for the agent; no retry loop is needed.
	// It carries fresh entropy and the time: a VM restored from a
	// template shares both with its siblings until the agent applies them
	// (docs/templates.md).
	req, err := pingRequest()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	resp, err := c.Ping(ctx, req)
	if err != nil {
		c.Close()
		return nil, nil, fmt.Errorf("waiting for the guest agent: %w", err)
	}
	if _, err := syncClock(ctx, c, time.Now); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, resp, nil
}

// Close closes the connection. It is idempotent.
func (c *Client) Close() error {
	err := c.ttrpc.Close()
	if cerr := c.conn.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
		err = cerr
	}
	return err
}

// ExecError reports a container command that could not be executed, with
// the exit code shells and runc use for it (126 or 127).
type ExecError struct {
	Code   int
	Path   string
	Reason string
	msg    string
}

func (e *ExecError) Error() string { return e.msg }

// AsExecError converts an agent error carrying an ExecError detail.
func AsExecError(err error) (*ExecError, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return nil, false
	}
	for _, d := range st.Details() {
		if ee, ok := d.(*agent.ExecError); ok {
			return &ExecError{Code: int(ee.Code), Path: ee.Path, Reason: ee.Reason, msg: st.Message()}, true
		}
	}
	return nil, false
}

// IsNotFound reports whether the agent answered NotFound.
func IsNotFound(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.NotFound
}

// Message is the agent's error text without the RPC wrapping, for users.
func Message(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	return err.Error()
}

// Err converts an error the agent answered into the errdefs kind its
// status code names (NotFound → errdefs.ErrNotFound, DeadlineExceeded →
// context.DeadlineExceeded, ...), keeping the agent's message, so the
// shim's edge hands containerd the agent's code rather than Unknown.
// An error that is not an agent status (the connection broke) is kept.
func Err(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); !ok {
		return err
	}
	return errdefs.FromGRPC(err)
}

// EntropyBytes is how much host entropy each Ping carries: 64 bytes,
// twice the CRNG's 256-bit key.
const EntropyBytes = 64

// pingRequest is the first request of a connection: host entropy and
// the host's clock.
func pingRequest() (*agent.PingRequest, error) {
	b := make([]byte, EntropyBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("reading host entropy for the guest: %w", err)
	}
	return &agent.PingRequest{Entropy: b, HostTimeUnixNs: time.Now().UnixNano()}, nil
}
