package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// chunk is the most bytes one stdio call carries; well under ttrpc's
// 4 MiB message limit.
const chunk = 256 << 10

// Stream selects a process's output stream.
type Stream int

const (
	Stdout Stream = iota
	Stderr
)

func (s Stream) String() string {
	if s == Stderr {
		return "stderr"
	}
	return "stdout"
}

// CopyOut copies one output stream of a guest process to w until the
// agent reports EOF. Calls are issued one at a time, so order is kept.
func (c *Client) CopyOut(ctx context.Context, containerID, execID string, s Stream, w io.Writer) error {
	req := &agent.ReadStreamRequest{ContainerId: containerID, ExecId: execID, Max: chunk}
	read := c.ReadStdout
	if s == Stderr {
		read = c.ReadStderr
	}
	for {
		resp, err := read(ctx, req)
		if err != nil {
			return fmt.Errorf("reading %s of %s: %w", s, processName(containerID, execID), err)
		}
		if len(resp.Data) > 0 {
			if _, err := w.Write(resp.Data); err != nil {
				return fmt.Errorf("writing %s of %s: %w", s, processName(containerID, execID), err)
			}
		}
		if resp.Eof {
			return nil
		}
	}
}

// CopyIn sends r to the process's stdin and closes stdin at r's EOF.
func (c *Client) CopyIn(ctx context.Context, containerID, execID string, r io.Reader) error {
	buf := make([]byte, chunk)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := c.WriteStdin(ctx, &agent.WriteStdinRequest{ContainerId: containerID, ExecId: execID, Data: buf[:n]}); err != nil {
				return fmt.Errorf("writing stdin of %s: %w", processName(containerID, execID), err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("reading stdin for %s: %w", processName(containerID, execID), rerr)
		}
	}
	if _, err := c.CloseStdin(ctx, &agent.ProcessRequest{ContainerId: containerID, ExecId: execID}); err != nil {
		return fmt.Errorf("closing stdin of %s: %w", processName(containerID, execID), err)
	}
	return nil
}

func processName(containerID, execID string) string {
	if execID == "" {
		return "container " + containerID
	}
	return fmt.Sprintf("exec %s in container %s", execID, containerID)
}
