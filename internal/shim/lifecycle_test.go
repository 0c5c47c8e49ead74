package shim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	ptypes "github.com/containerd/containerd/protobuf/types"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"

	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
)

// sandboxBundle writes a bundle for sandbox task id with annotations.
func sandboxBundle(t *testing.T, id string, annotations map[string]string) string {
	t.Helper()
	bundle := filepath.Join(t.TempDir(), id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	ann := map[string]string{annotationSandboxID: id, sandbox.AnnotationContainerType: sandbox.ContainerTypeSandbox}
	for k, v := range annotations {
		ann[k] = v
	}
	// A network namespace of its own (no CNI): a spec without one asks
	// for the host's, which Create refuses (hostnet.go).
	linux := &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace}}}
	b, _ := json.Marshal(&specs.Spec{Version: specs.Version, Annotations: ann, Root: &specs.Root{Path: "rootfs"}, Linux: linux})
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return bundle
}

func requireStoreEmpty(t *testing.T, store *state.Store) {
	t.Helper()
	list, err := store.List()
	if err != nil || len(list) > 0 {
		t.Fatalf("store after a failed create: %+v %v", list, err)
	}
	ents, _ := os.ReadDir(store.Root)
	for _, e := range ents {
		t.Errorf("left in %s: %s", store.Root, e.Name())
	}
}

// The sandbox's state is created by the serving process (the owner),
// and a boot that fails after recording and acquiring resources is
// rolled back by the shim through the one release path, even when the
// boot itself left them.
func TestCreateRollsBackFailedBoot(t *testing.T) {
	s, _, _ := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	var seen state.Sandbox
	s.newSandbox = func(ctx context.Context, o sandbox.Options) (*sandbox.Sandbox, error) {
		seen = o.State.State()
		dir := filepath.Join(o.State.Dir(), "shared")
		if err := o.State.Record(state.Resource{Kind: state.KindDir, Key: dir}); err != nil {
			return nil, err
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, err
		}
		return nil, errors.New("the fake VM would not boot")
	}
	bundle := sandboxBundle(t, "pod1", nil)
	_, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle})
	if err == nil || !strings.Contains(err.Error(), "the fake VM would not boot") {
		t.Fatalf("Create: %v", err)
	}
	if seen.ShimPid != os.Getpid() || seen.ShimStartTime == 0 || seen.Bundle != bundle || seen.Namespace != "k8s.io" || seen.Phase != state.PhaseCreating {
		t.Errorf("state at boot: %+v", seen)
	}
	requireStoreEmpty(t, s.store)
	// The next create of the same sandbox starts from a clean slate.
	if _, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle}); err == nil || strings.Contains(err.Error(), "exist") {
		t.Fatalf("second Create: %v", err)
	}
	requireStoreEmpty(t, s.store)
}

// A state left by a dead shim of the same sandbox is released before a
// new one is created; a live owner's is refused.
func TestCreateReplacesStateOfDeadOwner(t *testing.T) {
	s, _, _ := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	old, err := s.store.Create("pod1", state.Sandbox{ShimPid: 1 << 22, ShimStartTime: 1})
	if err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(old.Dir(), "stale")
	old.Record(state.Resource{Kind: state.KindDir, Key: stale})
	os.Mkdir(stale, 0o700)
	old.Close()
	h, err := s.createState(context.Background(), "pod1", "/b")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if st := h.State(); st.ShimPid != os.Getpid() || len(st.Resources) != 0 {
		t.Errorf("new state: %+v", st)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the dead owner's directory was not released: %v", err)
	}
}

// With the failpoint build, state-create fails the sandbox's Create with
// the step's name and leaves nothing.
func TestCreateFailpointStateCreate(t *testing.T) {
	if !failpoint.Enabled {
		t.Skip("needs -tags hull_failpoints (make test runs it)")
	}
	s, _, _ := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	s.newSandbox = func(context.Context, sandbox.Options) (*sandbox.Sandbox, error) {
		t.Error("booted past the state-create failpoint")
		return nil, errors.New("unreachable")
	}
	bundle := sandboxBundle(t, "pod1", map[string]string{failpoint.Annotation: failpoint.StateCreate})
	_, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle})
	if err == nil || !strings.Contains(err.Error(), "failpoint state-create: injected failure") {
		t.Fatalf("Create: %v", err)
	}
	requireStoreEmpty(t, s.store)
}

// shim delete of the sandbox task releases the whole sandbox, killing
// QEMU by its recorded pid and start time; of another task, only that
// task's resources. Both are idempotent.
func TestShimDeleteReleases(t *testing.T) {
	store := &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	h, err := store.Create("pod1", state.Sandbox{ShimPid: 1 << 22, ShimStartTime: 1})
	if err != nil {
		t.Fatal(err)
	}
	cdir := filepath.Join(h.Dir(), "shared", "c1")
	sdir := filepath.Join(h.Dir(), "shared")
	for _, r := range []state.Resource{
		{Kind: state.KindDir, Key: sdir},
		{Kind: state.KindDir, Key: cdir, Container: "c1"},
	} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(cdir, 0o700)
	h.Close()
	ctx := context.Background()
	for range 2 {
		if err := releaseTaskState(ctx, store, "pod1", "c1", false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(cdir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("c1's directory left: %v", err)
	}
	if _, err := os.Lstat(sdir); err != nil {
		t.Errorf("a container's delete released the sandbox's: %v", err)
	}
	for range 2 {
		if err := releaseTaskState(ctx, store, "pod1", "pod1", true); err != nil {
			t.Fatal(err)
		}
	}
	requireStoreEmpty(t, store)
}

// The idle exit counts creates in flight: a slow boot (ten VMs booting
// at once under TCG take longer than the idle delay) must not see its
// shim exit under it.
func TestIdleExitWaitsForCreateInFlight(t *testing.T) {
	s, _, sd := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	booting, release := make(chan struct{}), make(chan struct{})
	s.newSandbox = func(ctx context.Context, o sandbox.Options) (*sandbox.Sandbox, error) {
		close(booting)
		<-release
		return nil, errors.New("the fake VM would not boot")
	}
	bundle := sandboxBundle(t, "pod1", nil)
	done := make(chan error, 1)
	go func() {
		_, err := s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle})
		done <- err
	}()
	<-booting
	s.exitIfIdle() // what the idle timer runs
	select {
	case <-sd.Done():
		t.Fatal("the shim shut down while a Create was booting its VM")
	default:
	}
	close(release)
	if err := <-done; err == nil {
		t.Fatal("Create succeeded with a VM that did not boot")
	}
	// Once the failed create is over, the shim holds nothing: it exits.
	s.exitIfIdle()
	select {
	case <-sd.Done():
	default:
		t.Fatal("the shim did not exit once idle")
	}
}

// `shim delete` of the sandbox task does not wait for the state lock a
// live owner holds (a shim in the middle of a boot holds it throughout):
// it stops the owner first, which drops the lock, then releases.
func TestShimDeleteStopsAnOwnerHoldingTheLock(t *testing.T) {
	store := &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	h, err := store.Create("pod1", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// The owner: a process that takes the sandbox's lock and keeps it.
	lock := filepath.Join(h.Dir(), "lock")
	owner := exec.Command("sh", "-c", `exec 9>"$1"; flock 9; exec sleep 60`, "sh", lock)
	if err := owner.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Process.Kill(); owner.Wait() })
	start, err := state.ProcessStartTime(owner.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Update(func(st *state.Sandbox) { st.ShimPid, st.ShimStartTime = owner.Process.Pid, start }); err != nil {
		t.Fatal(err)
	}
	h.Close()
	waitFor(t, "the owner to hold the lock", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", owner.Process.Pid))
		return strings.HasPrefix(string(b), "sleep")
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	if err := releaseTaskState(ctx, store, "pod1", "pod1", true); err != nil {
		t.Fatalf("shim delete: %v (after %v)", err, time.Since(begin))
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("shim delete took %v", took)
	}
	if state.ProcessAlive(owner.Process.Pid, start) {
		t.Error("the owner still runs")
	}
	requireStoreEmpty(t, store)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The shim's socket is a resource of the sandbox: released with it, so
// `hull gc` after a SIGKILLed shim (containerd gone) removes it too.
func TestSandboxStateRecordsShimSocket(t *testing.T) {
	s, _, _ := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	sock := filepath.Join(t.TempDir(), "s", "0123abcd")
	os.MkdirAll(filepath.Dir(sock), 0o700)
	if err := os.WriteFile(sock, nil, 0o600); err != nil { // stands for the socket file
		t.Fatal(err)
	}
	s.address = "unix://" + sock
	h, err := s.createState(context.Background(), "pod1", "/b")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, r := range h.State().Resources {
		found = found || (r.Kind == state.KindSocket && r.Path == sock)
	}
	if !found {
		t.Fatalf("shim socket not recorded: %+v", h.State().Resources)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sandbox.Release(ctx, h, ""); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("shim socket left after release: %v", err)
	}
	requireStoreEmpty(t, s.store)
}

// runtime.state_dir of the pod's configuration is where the sandbox's
// state goes, and the bundle tells `shim delete` so.
func TestStateDirFromConfig(t *testing.T) {
	s, _, _ := testService(t)
	root := filepath.Join(t.TempDir(), "hull-state")
	cfgFile := filepath.Join(t.TempDir(), "hull.toml")
	if err := os.WriteFile(cfgFile, []byte("[runtime]\nstate_dir = \""+root+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := proto.Marshal(&runtimeoptions.Options{ConfigPath: cfgFile})
	if err != nil {
		t.Fatal(err)
	}
	var stateDir string
	s.newSandbox = func(ctx context.Context, o sandbox.Options) (*sandbox.Sandbox, error) {
		stateDir = o.State.Dir()
		return nil, errors.New("the fake VM would not boot")
	}
	bundle := sandboxBundle(t, "pod1", nil)
	_, err = s.Create(context.Background(), &taskAPI.CreateTaskRequest{ID: "pod1", Bundle: bundle,
		Options: &ptypes.Any{TypeUrl: "runtimeoptions.v1.Options", Value: opts}})
	if err == nil {
		t.Fatal("Create succeeded with a VM that did not boot")
	}
	if stateDir != filepath.Join(root, "pod1") {
		t.Errorf("sandbox state in %q, want under %s", stateDir, root)
	}
	if got, err := readStateRoot(bundle); err != nil || got != root {
		t.Errorf("bundle's state root = %q, %v; want %s", got, err, root)
	}
	requireStoreEmpty(t, &state.Store{Root: root})
	// A bundle that has no note (a Create that failed earlier) means the
	// default root.
	if got, err := readStateRoot(t.TempDir()); err != nil || got != "/run/hull" {
		t.Errorf("state root of a bare bundle = %q, %v", got, err)
	}
}
