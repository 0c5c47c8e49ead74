package agent

import (
	"context"
	"fmt"
	"net"
	"testing"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/container"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

func TestToStatusCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("container %q: %w", "x", errdefs.ErrNotFound), codes.NotFound},
		{fmt.Errorf("x: %w", errdefs.ErrAlreadyExists), codes.AlreadyExists},
		{fmt.Errorf("x: %w", errdefs.ErrInvalidArgument), codes.InvalidArgument},
		{fmt.Errorf("x: %w", errdefs.ErrFailedPrecondition), codes.FailedPrecondition},
		{fmt.Errorf("creating: %w", &errdefs.ExecError{Code: 127, Path: "p", Reason: "r"}), codes.FailedPrecondition},
		{fmt.Errorf("plain"), codes.Unknown},
	} {
		if got := status.Code(ToStatus(c.err)); got != c.code {
			t.Errorf("%v: code %v, want %v", c.err, got, c.code)
		}
	}
}

// The ExecError detail survives the ttrpc wire and the client reads it back.
func TestExecErrorDetailOverTTRPC(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	srvConn, _ := net.FileConn(fileOf(fds[0]))
	cliConn, _ := net.FileConn(fileOf(fds[1]))
	srv, _ := ttrpc.NewServer()
	svc := &Service{Containers: container.NewManager(container.Config{CgroupRoot: t.TempDir()})}
	agentapi.RegisterAgentService(srv, execFailing{svc})
	go srv.Serve(context.Background(), &oneListener{c: srvConn, done: make(chan struct{})})
	defer srv.Close()
	client := ttrpc.NewClient(cliConn)
	defer client.Close()
	c := agentapi.NewAgentClient(client)

	// An unknown container: NotFound.
	_, err = c.WaitProcess(context.Background(), &agentapi.ProcessRequest{ContainerId: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("wait of unknown: %v", err)
	}
	// A malformed spec: InvalidArgument naming the field.
	_, err = c.CreateContainer(context.Background(), &agentapi.CreateContainerRequest{ContainerId: "a", OciSpec: []byte(`{"process":{"args":["sh"]}}`)})
	if status.Code(err) != codes.InvalidArgument || !contains(err.Error(), "root.path") {
		t.Fatalf("bad spec: %v", err)
	}
	// The exec error's detail, read back by the client.
	_, err = c.StartContainer(context.Background(), &agentapi.ContainerRequest{ContainerId: "c"})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("exec error code: %v", err)
	}
	xe, ok := ExecErrorFromStatus(err)
	if !ok || xe.Code != 127 || xe.Path != "nosuchcmd" {
		t.Fatalf("detail %v %v", xe, ok)
	}
	st, _ := status.FromError(err)
	if st.Message() != `exec "nosuchcmd": executable file not found in $PATH` {
		t.Fatalf("message %q", st.Message())
	}
}

func contains(s, sub string) bool { return len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0) }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
