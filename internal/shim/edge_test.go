package shim

import (
	"context"
	"fmt"
	"testing"

	"github.com/containerd/ttrpc"
	"github.com/hull-runtime/hull/internal/agentclient"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An agent's NotFound, wrapped on its way through the shim, reaches
// containerd as NotFound (not Unknown); a plain error stays Unknown.
func TestEdgeKeepsAgentCodes(t *testing.T) {
	call := func(err error) error {
		_, got := edgeInterceptor(context.Background(), nil, &ttrpc.UnaryServerInfo{FullMethod: "/t/Kill"},
			func(context.Context, func(any) error) (any, error) { return nil, err })
		return got
	}
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("killing c1: %w", agentclient.Err(status.Error(codes.NotFound, "container c1 not found"))), codes.NotFound},
		{fmt.Errorf("creating c1 in the VM: %w", agentclient.Err(status.Error(codes.InvalidArgument, "bad spec: process.args is empty"))), codes.InvalidArgument},
		{fmt.Errorf("stats: %w", agentclient.Err(status.Error(codes.DeadlineExceeded, "timed out"))), codes.DeadlineExceeded},
		{status.Error(codes.AlreadyExists, "task c1"), codes.AlreadyExists},
		{fmt.Errorf("mounting rootfs"), codes.Unknown},
	} {
		got := call(tc.err)
		if status.Code(got) != tc.want {
			t.Errorf("%v: code %v, want %v", tc.err, status.Code(got), tc.want)
		}
	}
	if call(nil) != nil {
		t.Error("a nil error did not stay nil")
	}
}
