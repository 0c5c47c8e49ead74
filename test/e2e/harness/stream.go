package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/websocket"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The channels of Kubernetes' streaming protocol (v4.channel.k8s.io):
// the first byte of each websocket message.
const (
	chanStdin  = 0
	chanStdout = 1
	chanStderr = 2
	chanError  = 3
	chanResize = 4
)

// ExecResult is what a streamed exec returned.
type ExecResult struct {
	// Output is everything read from stdout (with a tty: the terminal,
	// which echoes input and turns "\n" into "\r\n").
	Output   string
	Stderr   string
	ExitCode int
}

// ExecStream runs cmd in a container through CRI's Exec, as `kubectl exec
// -i [-t]` does through kubelet: it asks for a streaming URL, connects to
// containerd's streaming server over a websocket (Kubernetes'
// v4.channel.k8s.io protocol), sends a terminal size (with tty) and
// stdin, and reads until the command ends.
func (c *CRI) ExecStream(ctx context.Context, id string, tty bool, stdin string, cmd ...string) (*ExecResult, error) {
	resp, err := c.RuntimeServiceClient.Exec(ctx, &runtime.ExecRequest{
		ContainerId: id, Cmd: cmd, Tty: tty, Stdin: stdin != "", Stdout: true, Stderr: !tty,
	})
	if err != nil {
		return nil, fmt.Errorf("CRI Exec: %w", err)
	}
	u, err := url.Parse(resp.Url)
	if err != nil {
		return nil, fmt.Errorf("streaming URL %q: %w", resp.Url, err)
	}
	// The streaming server listens on 127.0.0.1 of containerd's network
	// namespace.
	raw, err := dialInNetns(ctx, c.netnsPath, u.Host)
	if err != nil {
		return nil, fmt.Errorf("connecting to the streaming server %s: %w", u.Host, err)
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	wsURL := *u
	wsURL.Scheme = "ws"
	cfg, err := websocket.NewConfig(wsURL.String(), "http://localhost/")
	if err != nil {
		return nil, err
	}
	cfg.Protocol = []string{"v4.channel.k8s.io"}
	ws, err := websocket.NewClient(cfg, raw)
	if err != nil {
		return nil, fmt.Errorf("websocket handshake with %s: %w", resp.Url, err)
	}
	defer ws.Close()

	send := func(ch byte, b []byte) error {
		return websocket.Message.Send(ws, append([]byte{ch}, b...))
	}
	if tty {
		size, _ := json.Marshal(map[string]uint16{"Width": 100, "Height": 40})
		if err := send(chanResize, size); err != nil {
			return nil, fmt.Errorf("sending the terminal size: %w", err)
		}
	}
	if stdin != "" {
		if err := send(chanStdin, []byte(stdin)); err != nil {
			return nil, fmt.Errorf("sending stdin: %w", err)
		}
	}
	var out, errOut, status strings.Builder
	for {
		var msg []byte
		if err := websocket.Message.Receive(ws, &msg); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return &ExecResult{Output: out.String(), Stderr: errOut.String()},
				fmt.Errorf("reading the stream (output so far %q): %w", out.String(), err)
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case chanStdout:
			out.Write(msg[1:])
		case chanStderr:
			errOut.Write(msg[1:])
		case chanError:
			status.Write(msg[1:])
		}
	}
	res := &ExecResult{Output: out.String(), Stderr: errOut.String()}
	code, err := exitCodeOf(status.String())
	res.ExitCode = code
	return res, err
}

// exitCodeOf reads the exit code from the status the server sends on the
// error channel: a Kubernetes metav1.Status.
func exitCodeOf(s string) (int, error) {
	if strings.TrimSpace(s) == "" {
		return -1, errors.New("the stream ended without a status")
	}
	var st struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		Reason  string `json:"reason"`
		Details struct {
			Causes []struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"causes"`
		} `json:"details"`
	}
	if err := json.Unmarshal([]byte(s), &st); err != nil {
		return -1, fmt.Errorf("exec status %q: %w", s, err)
	}
	if st.Status == "Success" {
		return 0, nil
	}
	if st.Reason == "NonZeroExitCode" {
		for _, c := range st.Details.Causes {
			if c.Reason == "ExitCode" {
				n, err := strconv.Atoi(c.Message)
				if err != nil {
					return -1, fmt.Errorf("exec status %q: %w", s, err)
				}
				return n, nil
			}
		}
	}
	return -1, fmt.Errorf("exec failed: %s", st.Message)
}

// dialInNetns opens a TCP connection from inside the network namespace at
// nsPath: the socket belongs to the namespace it was created in, so the
// dialling thread enters it for the socket call and then returns.
func dialInNetns(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := os.Open(nsPath)
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("entering %s: %w", nsPath, err)}
			return
		}
		d := net.Dialer{Timeout: 10 * time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		// Back to the original namespace; a thread that cannot go back
		// stays locked, and Go ends it with this goroutine.
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
