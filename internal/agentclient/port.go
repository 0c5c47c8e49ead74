package agentclient

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// closeTimeout bounds the ClosePort call of PortConn.Close.
const closeTimeout = 5 * time.Second

// PortConn is a TCP connection the agent opened to 127.0.0.1:port in the
// guest (docs/port-forward.md), read and written through the agent's
// port calls. Read and Write may run at the same time; neither may run
// concurrently with itself.
type PortConn struct {
	c    *Client
	id   uint64
	port int

	ctx    context.Context // cancelled by Close: ends a pending read
	cancel context.CancelFunc
	once   sync.Once

	buf []byte // read from the guest, not yet returned
	eof bool
}

// DialPort asks the agent to connect to port on the guest's 127.0.0.1.
func (c *Client) DialPort(ctx context.Context, port int) (*PortConn, error) {
	resp, err := c.OpenPort(ctx, &agent.OpenPortRequest{Port: uint32(port)})
	if err != nil {
		return nil, fmt.Errorf("opening guest port %d: %s", port, Message(err))
	}
	pc := &PortConn{c: c, id: resp.Id, port: port}
	pc.ctx, pc.cancel = context.WithCancel(context.Background())
	return pc, nil
}

func (p *PortConn) Read(b []byte) (int, error) {
	for len(p.buf) == 0 {
		if p.eof {
			return 0, io.EOF
		}
		resp, err := p.c.ReadPort(p.ctx, &agent.ReadPortRequest{Id: p.id, Max: chunk})
		if err != nil {
			return 0, fmt.Errorf("reading from guest port %d: %w", p.port, err)
		}
		p.buf, p.eof = resp.Data, resp.Eof
	}
	n := copy(b, p.buf)
	p.buf = p.buf[n:]
	return n, nil
}

func (p *PortConn) Write(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		end := min(len(b), written+chunk)
		if _, err := p.c.WritePort(p.ctx, &agent.WritePortRequest{Id: p.id, Data: b[written:end]}); err != nil {
			return written, fmt.Errorf("writing to guest port %d: %w", p.port, err)
		}
		written = end
	}
	return written, nil
}

// CloseWrite shuts down the guest connection's sending side.
func (p *PortConn) CloseWrite() error {
	if _, err := p.c.ClosePort(p.ctx, &agent.ClosePortRequest{Id: p.id, WriteOnly: true}); err != nil {
		return fmt.Errorf("shutting down writes to guest port %d: %w", p.port, err)
	}
	return nil
}

// Close closes the guest connection; a pending Read returns. Idempotent.
func (p *PortConn) Close() error {
	var err error
	p.once.Do(func() {
		p.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		if _, cerr := p.c.ClosePort(ctx, &agent.ClosePortRequest{Id: p.id}); cerr != nil {
			err = fmt.Errorf("closing guest port %d: %w", p.port, cerr)
		}
	})
	return err
}
