package agentclient

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestErrKeepsTheAgentsCode(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		kind error
	}{
		{codes.NotFound, errdefs.ErrNotFound},
		{codes.InvalidArgument, errdefs.ErrInvalidArgument},
		{codes.FailedPrecondition, errdefs.ErrFailedPrecondition},
		{codes.AlreadyExists, errdefs.ErrAlreadyExists},
		{codes.DeadlineExceeded, context.DeadlineExceeded},
		{codes.Unimplemented, errdefs.ErrNotImplemented},
	} {
		err := Err(status.Errorf(tc.code, "container c1 is gone"))
		if !errors.Is(err, tc.kind) {
			t.Errorf("%v: got %v, want an error wrapping %v", tc.code, err, tc.kind)
		}
		if !strings.Contains(err.Error(), "container c1 is gone") {
			t.Errorf("%v: message lost: %v", tc.code, err)
		}
		// And back at the shim's edge: the same code.
		if got := status.Code(errdefs.ToGRPC(err)); got != tc.code {
			t.Errorf("%v: round trip gives %v", tc.code, got)
		}
	}
	plain := errors.New("connection reset")
	if got := Err(plain); got != plain {
		t.Errorf("a transport error changed: %v", got)
	}
	if Err(nil) != nil {
		t.Error("Err(nil) != nil")
	}
}
