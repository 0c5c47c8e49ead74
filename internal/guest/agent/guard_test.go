package agent

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/container"
)

// panicking panics in one handler.
type panicking struct{ *Service }

func (panicking) StartContainer(context.Context, *agentapi.ContainerRequest) (*agentapi.Empty, error) {
	var m map[string]int
	m["boom"]++ // nil map: panics
	return nil, nil
}

// A panic in a handler fails that request with Internal and logs the
// stack; the server keeps serving.
func TestHandlerPanicRecovered(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	srvConn, _ := net.FileConn(fileOf(fds[0]))
	cliConn, _ := net.FileConn(fileOf(fds[1]))
	var logBuf strings.Builder
	log := slog.New(slog.NewTextHandler(&syncWriter{b: &logBuf}, nil))
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(recoverPanics(log)))
	if err != nil {
		t.Fatal(err)
	}
	svc := &Service{Containers: container.NewManager(container.Config{CgroupRoot: t.TempDir()})}
	agentapi.RegisterAgentService(srv, panicking{svc})
	go srv.Serve(context.Background(), &oneListener{c: srvConn, done: make(chan struct{})})
	defer srv.Close()
	client := ttrpc.NewClient(cliConn)
	defer client.Close()
	c := agentapi.NewAgentClient(client)

	_, err = c.StartContainer(context.Background(), &agentapi.ContainerRequest{ContainerId: "c"})
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "panicked") || !strings.Contains(err.Error(), "StartContainer") {
		t.Fatalf("panicking handler: %v", err)
	}
	// Still serving.
	_, err = c.WaitProcess(context.Background(), &agentapi.ProcessRequest{ContainerId: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("after the panic: %v", err)
	}
	if l := logBuf.String(); !strings.Contains(l, "request handler panicked") || !strings.Contains(l, "guard_test.go") {
		t.Errorf("log lacks the panic and its stack: %s", l)
	}
}

type syncWriter struct{ b *strings.Builder }

func (w *syncWriter) Write(p []byte) (int, error) { return w.b.Write(p) }
