package shim

import (
	"context"
	"log/slog"
	"os"

	"github.com/containerd/log"

	"github.com/hull-runtime/hull/internal/portforward"
	"github.com/hull-runtime/hull/internal/sandbox"
)

// startPortForward makes CRI PortForward reach the pod: connections that
// containerd opens to 127.0.0.1 in the pod netns are relayed to the same
// port in the guest (internal/portforward, docs/port-forward.md). The
// forwarder ends when the VM does; the returned function ends it sooner
// (a failed create). A forwarder that cannot start leaves the pod
// running without port forwarding, and says so in the log.
func (s *service) startPortForward(sb *sandbox.Sandbox, netns string, logger *log.Entry) func() error {
	if netns == "" {
		return func() error { return nil }
	}
	client := sb.Agent()
	dial := func(ctx context.Context, port int) (portforward.Conn, error) {
		return client.DialPort(ctx, port)
	}
	// The shim package points stderr at containerd's log FIFO.
	slogger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("sandbox", sb.ID)
	f, err := portforward.Start(netns, dial, slogger)
	if err != nil {
		logger.WithError(err).Warn("port forwarding (CRI PortForward) will not reach this pod")
		return func() error { return nil }
	}
	go func() {
		<-sb.Dead()
		if err := f.Close(); err != nil {
			logger.WithError(err).Warn("stopping port forwarding")
		}
	}()
	return f.Close
}
