package agent

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

// execFailing fails StartContainer with an exec error, as a real start of a
// missing command does, so the detail crosses the wire.
type execFailing struct{ *Service }

func (execFailing) StartContainer(context.Context, *agentapi.ContainerRequest) (*agentapi.Empty, error) {
	return nil, ToStatus(fmt.Errorf("starting container %q: %w", "c", &errdefs.ExecError{Code: 127, Path: "nosuchcmd", Reason: "executable file not found in $PATH"}))
}

func fileOf(fd int) *os.File { return os.NewFile(uintptr(fd), "sock") }

type oneListener struct {
	c    net.Conn
	done chan struct{}
	once sync.Once
}

func (l *oneListener) Accept() (net.Conn, error) {
	if c := l.c; c != nil {
		l.c = nil
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}
func (l *oneListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *oneListener) Addr() net.Addr { return &net.UnixAddr{} }
