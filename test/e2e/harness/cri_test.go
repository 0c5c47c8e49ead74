package harness

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// removals answers StopPodSandbox with success and RemovePodSandbox with
// the next of its errors (nil once they run out), counting the calls.
type removals struct {
	runtime.RuntimeServiceClient
	errs    []error
	removes int
}

func (r *removals) StopPodSandbox(context.Context, *runtime.StopPodSandboxRequest, ...grpc.CallOption) (*runtime.StopPodSandboxResponse, error) {
	return &runtime.StopPodSandboxResponse{}, nil
}

func (r *removals) RemovePodSandbox(context.Context, *runtime.RemovePodSandboxRequest, ...grpc.CallOption) (*runtime.RemovePodSandboxResponse, error) {
	r.removes++
	if len(r.errs) == 0 {
		return &runtime.RemovePodSandboxResponse{}, nil
	}
	err := r.errs[0]
	r.errs = r.errs[1:]
	return nil, err
}

// containerd 1.7's own race: a late TaskOOM event rewrites the status file
// in the container's root directory while RemoveContainer deletes it.
var errRootDirRace = status.Error(codes.Unknown, `failed to remove container "c1": failed to remove container root directory "/x/containers/c1": unlinkat /x/containers/c1: directory not empty`)

// RemovePod retries containerd's root-directory race, as kubelet's next
// sync would, and nothing else.
func TestRemovePodRetriesContainerdsRootDirRace(t *testing.T) {
	r := &removals{errs: []error{errRootDirRace, errRootDirRace}}
	c := &CRI{RuntimeServiceClient: r}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.RemovePod(ctx, "p1"); err != nil {
		t.Fatalf("RemovePod: %v", err)
	}
	if r.removes != 3 {
		t.Errorf("RemovePodSandbox called %d times, want 3 (two races, then success)", r.removes)
	}
}

func TestRemovePodDoesNotRetryOtherErrors(t *testing.T) {
	other := status.Error(codes.Unknown, "failed to stop sandbox: shim said no")
	r := &removals{errs: []error{other}}
	c := &CRI{RuntimeServiceClient: r}
	err := c.RemovePod(context.Background(), "p1")
	if err == nil || !strings.Contains(err.Error(), "shim said no") {
		t.Fatalf("RemovePod: %v, want the shim's error", err)
	}
	if r.removes != 1 {
		t.Errorf("RemovePodSandbox called %d times, want 1", r.removes)
	}
}

// A race that does not end is reported when the context ends, with the
// race's own message.
func TestRemovePodGivesUpWithTheRace(t *testing.T) {
	r := &removals{errs: []error{errRootDirRace, errRootDirRace, errRootDirRace, errRootDirRace, errRootDirRace, errRootDirRace, errRootDirRace, errRootDirRace}}
	c := &CRI{RuntimeServiceClient: r}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := c.RemovePod(ctx, "p1")
	if err == nil || !strings.Contains(err.Error(), "directory not empty") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RemovePod: %v, want the race's error and the deadline", err)
	}
}
