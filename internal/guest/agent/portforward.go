package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/stdio"
)

// maxPortConns bounds the forwarded connections open at once, so a host
// that forgets to close them cannot exhaust the guest.
const maxPortConns = 256

// ports are the guest ends of forwarded connections (docs/port-forward.md):
// TCP connections to 127.0.0.1 in the guest's network namespace, which
// the pod's containers share.
type ports struct {
	mu    sync.Mutex
	next  uint64
	conns map[uint64]*portConn
}

type portConn struct {
	c   *net.TCPConn
	out *stdio.Stream // what the guest side sent, drained into a buffer
}

func (p *ports) open(ctx context.Context, port uint32) (uint64, error) {
	if port == 0 || port > 65535 {
		return 0, fmt.Errorf("forwarding port %d: %w", port, errdefs.ErrInvalidArgument)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp4", addr)
	if err != nil {
		return 0, fmt.Errorf("forwarding port %d: connecting to %s in the guest: %v: %w", port, addr, err, errdefs.ErrFailedPrecondition)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.conns) >= maxPortConns {
		c.Close()
		return 0, fmt.Errorf("forwarding port %d: %d connections open already: %w", port, len(p.conns), errdefs.ErrFailedPrecondition)
	}
	tc := c.(*net.TCPConn)
	pc := &portConn{c: tc, out: stdio.NewStream(readHalf{tc})}
	if p.conns == nil {
		p.conns = map[uint64]*portConn{}
	}
	p.next++
	p.conns[p.next] = pc
	return p.next, nil
}

func (p *ports) get(id uint64) (*portConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pc, ok := p.conns[id]
	if !ok {
		return nil, fmt.Errorf("forwarded connection %d: %w", id, errdefs.ErrNotFound)
	}
	return pc, nil
}

func (p *ports) close(id uint64, writeOnly bool) error {
	pc, err := p.get(id)
	if err != nil {
		return err
	}
	if writeOnly {
		if err := pc.c.CloseWrite(); err != nil {
			return fmt.Errorf("forwarded connection %d: shutting down writes: %w", id, err)
		}
		return nil
	}
	p.mu.Lock()
	delete(p.conns, id)
	p.mu.Unlock()
	pc.out.Close()
	if err := pc.c.Close(); err != nil {
		return fmt.Errorf("forwarded connection %d: closing: %w", id, err)
	}
	return nil
}

// readHalf is the read side of a connection: closing it (the drainer does
// at EOF) shuts down reads only, so the host may still send.
type readHalf struct{ c *net.TCPConn }

func (r readHalf) Read(b []byte) (int, error) { return r.c.Read(b) }
func (r readHalf) Close() error               { return r.c.CloseRead() }

func (s *Service) OpenPort(ctx context.Context, r *agentapi.OpenPortRequest) (*agentapi.OpenPortResponse, error) {
	id, err := s.ports.open(ctx, r.Port)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.OpenPortResponse{Id: id}, nil
}

func (s *Service) WritePort(ctx context.Context, r *agentapi.WritePortRequest) (*agentapi.WriteStdinResponse, error) {
	pc, err := s.ports.get(r.Id)
	if err != nil {
		return nil, ToStatus(err)
	}
	n, err := pc.c.Write(r.Data)
	if err != nil {
		return nil, ToStatus(fmt.Errorf("forwarded connection %d: writing: %w", r.Id, err))
	}
	return &agentapi.WriteStdinResponse{Len: uint32(n)}, nil
}

func (s *Service) ReadPort(ctx context.Context, r *agentapi.ReadPortRequest) (*agentapi.ReadStreamResponse, error) {
	pc, err := s.ports.get(r.Id)
	if err != nil {
		return nil, ToStatus(err)
	}
	data, eof, err := pc.out.Read(ctx, int(r.Max))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.ReadStreamResponse{Data: data, Eof: eof}, nil
}

func (s *Service) ClosePort(ctx context.Context, r *agentapi.ClosePortRequest) (*agentapi.Empty, error) {
	return &agentapi.Empty{}, ToStatus(s.ports.close(r.Id, r.WriteOnly))
}
