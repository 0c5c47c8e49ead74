package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/sandbox/sandboxtest"
	"github.com/hull-runtime/hull/internal/state"
)

// fakeSandbox is sandbox "sb", with its state in a fresh store, on a
// fake VM and a fake agent sharing one call log.
func fakeSandbox(t *testing.T) (*sandbox.Sandbox, *sandboxtest.VM, *sandboxtest.Agent, *sandboxtest.Calls, *state.Store) {
	t.Helper()
	store := &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	h, err := store.Create("sb", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close() // a sandbox keeps no handle: its callers lock the state
	cfg := config.Defaults()
	calls := &sandboxtest.Calls{}
	v, a := sandboxtest.NewVM(calls), sandboxtest.NewAgent(calls)
	// A VM still running when the test ends exits then, as QEMU does with
	// its shim: the sandbox's watcher ends with it.
	t.Cleanup(v.Exit)
	sb := sandbox.New(sandbox.Options{ID: "sb", Config: &cfg, State: h}, v, a, &agent.PingResponse{BootId: "boot-1"})
	if sb.Dir != h.Dir() || sb.BootID() != "boot-1" || sb.Agent() != sandbox.Agent(a) {
		t.Fatalf("New: dir %s, boot id %s", sb.Dir, sb.BootID())
	}
	return sb, v, a, calls, store
}

func isClosed(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

// PowerOff asks the guest to power off, then stops the VM, then closes
// the agent connection; a second call does nothing.
func TestPowerOffShutsDownThenStops(t *testing.T) {
	sb, _, _, calls, _ := fakeSandbox(t)
	for range 2 {
		if err := sb.PowerOff(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"agent.Shutdown", "vm.Stop", "agent.Close"}
	if got := calls.List(); !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
	if !isClosed(sb.Dead(), 5*time.Second) {
		t.Error("Dead not closed once the VM was stopped")
	}
}

// A VM that already exited gets no Shutdown (nobody would answer), but
// is still stopped (reaped) and its connection closed.
func TestPowerOffOfADeadVM(t *testing.T) {
	sb, v, _, calls, _ := fakeSandbox(t)
	v.Exit()
	if !isClosed(sb.Dead(), 5*time.Second) {
		t.Fatal("Dead not closed after the VM exited")
	}
	if err := sb.PowerOff(); err != nil {
		t.Fatal(err)
	}
	if got, want := calls.List(), []string{"vm.Stop", "agent.Close"}; !slices.Equal(got, want) {
		t.Errorf("calls = %q, want %q", got, want)
	}
}

// Dead closes when, and only when, the VM's process exits.
func TestDeadFollowsTheVM(t *testing.T) {
	sb, v, _, _, _ := fakeSandbox(t)
	if isClosed(sb.Dead(), 50*time.Millisecond) {
		t.Fatal("Dead closed while the VM runs")
	}
	v.Exit()
	if !isClosed(sb.Dead(), 5*time.Second) {
		t.Fatal("Dead not closed after the VM exited")
	}
}

// A failed stop of the VM is PowerOff's error, after the connection was
// closed all the same.
func TestPowerOffReportsAFailedStop(t *testing.T) {
	sb, v, a, calls, _ := fakeSandbox(t)
	v.StopErr = errors.New("qemu would not die")
	if err := sb.PowerOff(); err == nil || err.Error() != "qemu would not die" {
		t.Fatalf("PowerOff = %v", err)
	}
	if calls.Count("agent.Close") != 1 {
		t.Errorf("calls = %q, want the agent closed", calls.List())
	}
	if _, err := a.Shutdown(context.Background(), nil); !errors.Is(err, ttrpc.ErrClosed) {
		t.Errorf("agent call after PowerOff = %v, want ttrpc.ErrClosed", err)
	}
}

// Stop powers off and releases the whole sandbox: its state is gone.
func TestStopReleasesTheSandbox(t *testing.T) {
	sb, _, _, calls, store := fakeSandbox(t)
	h, err := store.Open("sb")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	dir := filepath.Join(h.Dir(), "shared")
	if err := h.Record(state.Resource{Kind: state.KindDir, Key: dir}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := sb.Stop(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if calls.Count("vm.Stop") != 1 {
		t.Errorf("calls = %q, want the VM stopped", calls.List())
	}
	if list, err := store.List(); err != nil || len(list) != 0 {
		t.Errorf("store after Stop: %+v, %v", list, err)
	}
}

// RemoveContainer: a container the agent does not know is removed; an
// agent error keeps its kind (agentclient.Err); a broken connection is
// ttrpc.ErrClosed, which the shim tells from a dying VM.
func TestRemoveContainerErrors(t *testing.T) {
	sb, _, a, calls, _ := fakeSandbox(t)
	ctx := context.Background()
	if err := sb.RemoveContainer(ctx, "c1"); err != nil {
		t.Errorf("removing an unknown container: %v", err)
	}
	a.Fail("RemoveContainer", status.Error(codes.FailedPrecondition, "cgroup busy"))
	err := sb.RemoveContainer(ctx, "c1")
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "removing container c1 in the VM: cgroup busy") {
		t.Errorf("RemoveContainer with the agent failing = %v, want FailedPrecondition", err)
	}
	a.Fail("RemoveContainer", nil)
	a.Die()
	if err := sb.RemoveContainer(ctx, "c1"); !errors.Is(err, ttrpc.ErrClosed) {
		t.Errorf("RemoveContainer with the agent gone = %v, want ttrpc.ErrClosed", err)
	}
	if n := calls.Count("agent.RemoveContainer c1"); n != 3 {
		t.Errorf("%d RemoveContainer calls, want 3: %q", n, calls.List())
	}
}

// InjectPanic asks the VM for an NMI; a VM that cannot send one says so.
func TestInjectPanic(t *testing.T) {
	sb, v, a, calls, _ := fakeSandbox(t)
	if err := sb.InjectPanic(context.Background()); err != nil || calls.Count("vm.InjectNMI") != 1 {
		t.Errorf("InjectPanic = %v, calls %q", err, calls.List())
	}
	cfg := config.Defaults()
	plain := sandbox.New(sandbox.Options{ID: "sb2", Config: &cfg}, struct{ sandbox.VM }{v}, a, nil)
	if err := plain.InjectPanic(context.Background()); err == nil || !strings.Contains(err.Error(), "injecting an NMI") {
		t.Errorf("InjectPanic of a VM without NMIs = %v", err)
	}
}
