package shim

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/sandbox/sandboxtest"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
	"github.com/hull-runtime/hull/internal/testenv"
)

// containerBundle writes a bundle for container id of sandbox sid, its
// rootfs a directory holding the file "hello".
func containerBundle(t *testing.T, id, sid string) string {
	t.Helper()
	bundle := filepath.Join(t.TempDir(), id)
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "hello"), []byte(id), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{
		Version:     specs.Version,
		Annotations: map[string]string{annotationSandboxID: sid, sandbox.AnnotationContainerType: "container"},
		Root:        &specs.Root{Path: "rootfs"},
		Process:     &specs.Process{Args: []string{"sleep", "1"}, Cwd: "/"},
		Linux:       &specs.Linux{},
	}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return bundle
}

// pauseBundle is sandboxBundle with a rootfs and the pause process, as
// containerd writes the sandbox task's.
func pauseBundle(t *testing.T, id string) string {
	t.Helper()
	bundle := sandboxBundle(t, id, nil)
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec, err := readSpec(bundle)
	if err != nil {
		t.Fatal(err)
	}
	spec.Process = &specs.Process{Args: []string{"/pause"}, Cwd: "/"}
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return bundle
}

// fakeBootService is a service whose sandboxes boot on a fake VM and
// agent: the host side of Boot that containers need (the sandbox's tree
// and its exported view) is real, the VM is not. Its agent has no Hull's
// pause.
func fakeBootService(t *testing.T) (*service, *sandboxtest.Agent, *sandboxtest.Calls) {
	t.Helper()
	return fakeBootServiceWith(t, &agent.PingResponse{BootId: "boot-1"})
}

// fakeBootServiceWith is fakeBootService whose agent answered ping.
func fakeBootServiceWith(t *testing.T, ping *agent.PingResponse) (*service, *sandboxtest.Agent, *sandboxtest.Calls) {
	t.Helper()
	s, _, _ := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	leakcheck.Register(t, s.store.Root)
	calls := &sandboxtest.Calls{}
	vm, ag := sandboxtest.NewVM(calls), sandboxtest.NewAgent(calls)
	t.Cleanup(vm.Exit)
	s.newSandbox = func(_ context.Context, o sandbox.Options) (*sandbox.Sandbox, error) {
		if err := storage.MakeShare(o.State, o.State.Dir()); err != nil {
			return nil, err
		}
		return sandbox.New(o, vm, ag, ping), nil
	}
	return s, ag, calls
}

// Create's host work on a fake VM: the sandbox's and a container's
// Creates bind the container's rootfs into the pod's tree (seen through
// the exported view, as the guest sees it), ask the agent to build both,
// and record everything; the container's Delete releases its mounts, the
// sandbox's Delete the rest. Root: the binds are real mounts.
func TestCreateOnFakeVM(t *testing.T) {
	testenv.Require(t, testenv.Root("Create binds a container's rootfs"))
	s, _, calls := fakeBootService(t)
	ctx := context.Background()
	sbBundle := pauseBundle(t, "pod1")
	if err := os.WriteFile(filepath.Join(sbBundle, "rootfs", "hello"), []byte("pod1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: sbBundle}); err != nil {
		t.Fatalf("Create pod1: %v", err)
	}
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "c1", Bundle: containerBundle(t, "c1", "pod1")}); err != nil {
		t.Fatalf("Create c1: %v", err)
	}
	shared := filepath.Join(s.store.Root, "pod1", storage.ShareName)
	if b, err := os.ReadFile(filepath.Join(shared, "c1", "rootfs", "hello")); err != nil || string(b) != "c1" {
		t.Errorf("c1's rootfs through the exported view: %q, %v", b, err)
	}
	// An agent without Hull's pause runs the sandbox image's command: its
	// rootfs is shared too.
	if b, err := os.ReadFile(filepath.Join(shared, "pod1", "rootfs", "hello")); err != nil || string(b) != "pod1" {
		t.Errorf("the sandbox's rootfs through the exported view: %q, %v", b, err)
	}
	for _, c := range []string{"agent.CreateContainer pod1", "agent.CreateContainer c1"} {
		if calls.Count(c) != 1 {
			t.Errorf("calls %q, want one %s", calls.List(), c)
		}
	}

	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatalf("Delete c1: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(shared, "c1")); err == nil {
		t.Error("c1's directory is left in the pod's tree after its Delete")
	}
	for _, r := range recordedFor(t, s.store, "pod1", "c1") {
		t.Errorf("c1's resource still recorded after its Delete: %s", r)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "pod1"}); err != nil {
		t.Fatalf("Delete pod1: %v", err)
	}
	requireStoreEmpty(t, s.store)
}

// With an agent that runs Hull's pause (its Ping says so), nothing of a
// CRI sandbox container's rootfs reaches the host's share: containerd's
// rootfs mounts are not mounted on the bundle, nothing is bound into the
// pod's tree or recorded for it, while the pod's other containers are
// shared as before (docs/sandbox.md).
func TestSandboxRootfsNotSharedForHullPause(t *testing.T) {
	testenv.Require(t, testenv.Root("Create binds a container's rootfs"))
	s, _, calls := fakeBootServiceWith(t, &agent.PingResponse{BootId: "boot-1", SandboxPause: true})
	ctx := context.Background()
	sbBundle := pauseBundle(t, "pod1")
	image := t.TempDir() // the pause image's snapshot, as a bind mount
	if err := os.WriteFile(filepath.Join(image, "hello"), []byte("pod1"), 0o644); err != nil {
		t.Fatal(err)
	}
	rootfs := []*types.Mount{{Type: "bind", Source: image, Options: []string{"rbind", "ro"}}}
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: sbBundle, Rootfs: rootfs}); err != nil {
		t.Fatalf("Create pod1: %v", err)
	}
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "c1", Bundle: containerBundle(t, "c1", "pod1")}); err != nil {
		t.Fatalf("Create c1: %v", err)
	}
	if calls.Count("agent.CreateContainer pod1") != 1 {
		t.Errorf("calls %q, want the sandbox created in the guest", calls.List())
	}
	if _, err := os.Lstat(filepath.Join(sbBundle, "rootfs", "hello")); err == nil {
		t.Error("the sandbox's rootfs mounts were mounted on its bundle")
	}
	shared := filepath.Join(s.store.Root, "pod1", storage.ShareName)
	if _, err := os.Lstat(filepath.Join(shared, "pod1")); err == nil {
		t.Error("the sandbox container has a directory in the pod's share")
	}
	if b, err := os.ReadFile(filepath.Join(shared, "c1", "rootfs", "hello")); err != nil || string(b) != "c1" {
		t.Errorf("c1's rootfs through the exported view: %q, %v", b, err)
	}
	for _, r := range recordedFor(t, s.store, "pod1", "pod1") {
		t.Errorf("a resource recorded for the sandbox container: %s", r)
	}
	for _, id := range []string{"c1", "pod1"} {
		if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: id}); err != nil {
			t.Fatalf("Delete %s: %v", id, err)
		}
	}
	requireStoreEmpty(t, s.store)
}

// recordedFor is what pod's state records for container.
func recordedFor(t *testing.T, store *state.Store, pod, container string) []state.Resource {
	t.Helper()
	st, err := store.Peek(pod)
	if err != nil {
		t.Fatal(err)
	}
	var rs []state.Resource
	for _, r := range st.Resources {
		if r.Container == container {
			rs = append(rs, r)
		}
	}
	return rs
}

// A container whose creation the agent refuses: Create fails with the
// agent's kind and message, and every host step of that container is
// undone, while the pod and its other containers are untouched.
func TestCreateRollsBackRefusedContainer(t *testing.T) {
	testenv.Require(t, testenv.Root("Create binds a container's rootfs"))
	s, ag, _ := fakeBootService(t)
	ctx := context.Background()
	sbBundle := pauseBundle(t, "pod1")
	if _, err := s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: sbBundle}); err != nil {
		t.Fatalf("Create pod1: %v", err)
	}
	before, err := s.store.Peek("pod1")
	if err != nil {
		t.Fatal(err)
	}
	ag.Fail("CreateContainer", status.Error(codes.InvalidArgument, "no such executable"))
	_, err = s.Create(ctx, &taskAPI.CreateTaskRequest{ID: "c2", Bundle: containerBundle(t, "c2", "pod1")})
	// Inside, the error carries its errdefs kind; the edge (edge.go)
	// makes it a status.
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "no such executable") {
		t.Errorf("Create c2 with the agent refusing = %v, want InvalidArgument with the agent's message", err)
	}
	shared := filepath.Join(s.store.Root, "pod1", storage.ShareName)
	if _, err := os.Lstat(filepath.Join(shared, "c2")); err == nil {
		t.Error("c2's directory is left in the pod's tree after its failed Create")
	}
	after, err := s.store.Peek("pod1")
	if err != nil {
		t.Fatal(err)
	}
	if len(after.Resources) != len(before.Resources) {
		t.Errorf("the pod's record changed by a failed container: %d resources before, %d after", len(before.Resources), len(after.Resources))
	}
	if _, err := s.State(ctx, &taskAPI.StateRequest{ID: "c2"}); !errdefs.IsNotFound(errdefs.FromGRPC(err)) {
		t.Errorf("State of the failed c2 = %v, want NotFound", err)
	}
	ag.Fail("CreateContainer", nil)
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "pod1"}); err != nil {
		t.Fatalf("Delete pod1: %v", err)
	}
	requireStoreEmpty(t, s.store)
}
