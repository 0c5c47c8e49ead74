package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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

func TestSealedCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bin")
	sh, err := exec.LookPath("true")
	if err != nil {
		t.Skip("needs true(1)")
	}
	data, _ := os.ReadFile(sh)
	os.WriteFile(src, data, 0o755)
	f, err := SealedCopy(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE; seals&want != want {
		t.Errorf("seals %#x, want %#x", seals, want)
	}
	// Neither the fd nor a new open of /proc/self/fd/N can write it.
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("write to the sealed copy: %v, want EPERM", err)
	}
	p := "/proc/self/fd/" + itoa(int(f.Fd()))
	if w, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
		if _, err := w.Write([]byte("x")); !errors.Is(err, unix.EPERM) {
			t.Errorf("write through %s: %v, want EPERM", p, err)
		}
		w.Close()
	}
	if err := unix.Ftruncate(int(f.Fd()), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("truncate: %v, want EPERM", err)
	}
	// It runs, also for a child given more descriptors than the helper
	// (fork places them at 3, 4, ...: the copy must not be one of them).
	cmd := exec.Command(p)
	for i := 0; i < 8; i++ {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		defer w.Close()
		cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	}
	if err := cmd.Run(); err != nil {
		t.Errorf("running the sealed copy at fd %d with %d extra files: %v", f.Fd(), len(cmd.ExtraFiles), err)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}
