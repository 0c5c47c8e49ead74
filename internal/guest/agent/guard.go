package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// recoverPanics is the server's interceptor: a panic in a request handler
// fails that request (codes.Internal) and logs the stack, instead of
// killing PID 1 and with it the pod. Panics in goroutines a handler starts
// are not caught.
func recoverPanics(log *slog.Logger) ttrpc.UnaryServerInterceptor {
	return func(ctx context.Context, um ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, m ttrpc.Method) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("request handler panicked", "method", info.FullMethod, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
				resp, err = nil, status.Errorf(codes.Internal, "%s: agent handler panicked: %v", info.FullMethod, r)
			}
		}()
		return m(ctx, um)
	}
}

// usedSignals are those the agent handles: SIGCHLD (the reaper), SIGIO
// (the host connecting to the agent channel, internal/guest/channel), and
// SIGURG, which the Go runtime uses to preempt goroutines and the kernel
// ignores by default. SIGKILL and SIGSTOP cannot be caught; the kernel
// does not deliver them to PID 1 from its own namespace. A container
// that sends PID 1 SIGIO only makes the channel read once more.
var usedSignals = map[syscall.Signal]bool{unix.SIGCHLD: true, unix.SIGIO: true, unix.SIGURG: true, unix.SIGKILL: true, unix.SIGSTOP: true}

// ignoreSignals makes every other signal, up to the last real-time one,
// ignored, so that a process that can signal PID 1 (kill -TERM 1) cannot
// make the Go runtime exit the agent. Children inherit ignored signals;
// the helper restores the defaults before exec
// (internal/guest/nsinit/process.go).
func ignoreSignals() {
	var sigs []os.Signal
	for s := syscall.Signal(1); s <= 64; s++ {
		if !usedSignals[s] {
			sigs = append(sigs, s)
		}
	}
	signal.Ignore(sigs...)
}

// highFD is the lowest descriptor SealedCopy returns.
const highFD = 100

// SealedCopy copies the binary at path into a sealed memfd (no write,
// grow, shrink, or new seals): the copy the agent re-executes as the
// container helper, so that a container process that reaches the helper's
// /proc/<pid>/exe cannot overwrite the agent's binary (runc's
// CVE-2019-5736). The file is close-on-exec; execve of
// /proc/self/fd/<fd> opens it before the close.
func SealedCopy(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s to seal a copy: %w", path, err)
	}
	defer src.Close()
	// memfd_create("hull-agent", MFD_CLOEXEC|MFD_ALLOW_SEALING)
	fd, err := unix.MemfdCreate("hull-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("creating memfd for a copy of %s: %w", path, err)
	}
	// Above the descriptors a helper is given (fork's dup2 onto 0..n
	// would replace the copy the child is about to execute).
	high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, highFD)
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("moving the memfd copy of %s: %w", path, err)
	}
	f := os.NewFile(uintptr(high), "memfd:hull-agent")
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, fmt.Errorf("copying %s into a memfd: %w", path, err)
	}
	// fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL|F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_WRITE)
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("sealing the memfd copy of %s: %w", path, err)
	}
	return f, nil
}
