package agent

import (
	"context"
	"fmt"
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
