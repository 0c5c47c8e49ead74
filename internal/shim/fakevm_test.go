package shim

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/sandbox/sandboxtest"
	"github.com/hull-runtime/hull/internal/state"
)

// fakePod is a shim service whose pod "pod1" runs on a fake VM and a
// fake agent: the sandbox task and container task c1 created, as after
// their Creates (the agent holds both; the shim watches them and the
// VM). Create's host work needs root (tested in lifecycle_test.go and
// the e2e suites); what follows it does not.
type fakePod struct {
	s     *service
	pub   *fakePublisher
	sb    *sandbox.Sandbox
	vm    *sandboxtest.VM
	agent *sandboxtest.Agent
	calls *sandboxtest.Calls
	sd    *fakeShutdown
}

func newFakePod(t *testing.T) *fakePod {
	t.Helper()
	s, pub, sd := testService(t)
	s.store = &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	h, err := s.store.Create("pod1", state.Sandbox{Namespace: "k8s.io"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Defaults()
	calls := &sandboxtest.Calls{}
	p := &fakePod{s: s, pub: pub, vm: sandboxtest.NewVM(calls), agent: sandboxtest.NewAgent(calls), calls: calls, sd: sd}
	p.sb = sandbox.New(sandbox.Options{ID: "pod1", Config: &cfg, State: h}, p.vm, p.agent, &agent.PingResponse{BootId: "boot-1"})
	h.Close()
	t.Cleanup(func() {
		p.sb.PowerOff()
		// The shim's VM watcher releases the sandbox once the VM is
		// gone, in its own goroutine: wait for it before the test's
		// directory is removed.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if ents, _ := os.ReadDir(s.store.Root); len(ents) == 0 {
				return
			}
		}
		t.Errorf("the sandbox was not released within 10 s of its VM's end")
	})
	for _, id := range []string{"pod1", "c1"} {
		p.create(t, id)
	}
	return p
}

// create builds container id in the fake guest and registers its task,
// as the end of a successful Create does.
func (p *fakePod) create(t *testing.T, id string) {
	t.Helper()
	resp, err := p.agent.CreateContainer(context.Background(), &agent.CreateContainerRequest{ContainerId: id})
	if err != nil {
		t.Fatal(err)
	}
	tk := &task{id: id, sandboxID: "pod1", bundle: "/b/" + id, isSandbox: id == "pod1", execs: map[string]*proc{}}
	tk.init = newProc(id, "", stdio{})
	tk.init.pid = resp.Pid
	p.s.register(&createCall{newTask: tk, pause: tk.isSandbox, sb: p.sb})
}

// wait is the task API's Wait of a process, bounded.
func (p *fakePod) wait(t *testing.T, id, execID string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := p.s.Wait(ctx, &taskAPI.WaitRequest{ID: id, ExecID: execID})
	if err != nil {
		t.Fatalf("Wait %s %s: %v", id, execID, err)
	}
	return r.ExitStatus
}

func (p *fakePod) storeEmpty() bool {
	list, err := p.s.store.List()
	return err == nil && len(list) == 0
}

// The task API's lifecycle of a pod on a fake VM: start, exec, kill,
// delete of a container, then of the sandbox, which powers the guest
// off, stops the VM and releases the sandbox's state; each step asks
// the agent what a real one is asked, and publishes its event.
func TestLifecycleOnFakeVM(t *testing.T) {
	p := newFakePod(t)
	s, ctx := p.s, context.Background()
	for _, id := range []string{"pod1", "c1"} {
		if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: id}); err != nil {
			t.Fatalf("Start %s: %v", id, err)
		}
	}
	// What a restarted containerd asks the shim that kept running.
	if c, err := s.Connect(ctx, &taskAPI.ConnectRequest{ID: "c1"}); err != nil || c.TaskPid == 0 {
		t.Errorf("Connect = %v, %v", c, err)
	}
	if st, err := s.State(ctx, &taskAPI.StateRequest{ID: "c1"}); err != nil || st.Status != tasktypes.Status_RUNNING {
		t.Errorf("State = %v, %v", st, err)
	}
	if _, err := s.Exec(ctx, &taskAPI.ExecProcessRequest{ID: "c1", ExecID: "e1", Spec: &ptypes.Any{Value: []byte(`{"args":["true"]}`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	p.agent.Exit("c1", "e1", 3)
	if got := p.wait(t, "c1", "e1"); got != 3 {
		t.Errorf("exec's exit status %d, want 3", got)
	}
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "c1", ExecID: "e1"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c1", "pod1"} {
		if _, err := s.Kill(ctx, &taskAPI.KillRequest{ID: id, Signal: uint32(syscall.SIGKILL)}); err != nil {
			t.Fatalf("Kill %s: %v", id, err)
		}
		if got := p.wait(t, id, ""); got != 137 {
			t.Errorf("%s's exit status %d, want 137", id, got)
		}
		if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: id}); err != nil {
			t.Fatalf("Delete %s: %v", id, err)
		}
	}
	want := []string{
		"agent.CreateContainer pod1", "agent.CreateContainer c1", // newFakePod
		"agent.StartContainer pod1", "agent.StartContainer c1", "agent.ExecProcess c1/e1",
		"agent.SignalProcess c1", "agent.RemoveContainer c1",
		"agent.SignalProcess pod1", "agent.RemoveContainer pod1",
		"agent.Shutdown", "vm.Stop", "agent.Close",
	}
	if got := p.calls.List(); !slices.Equal(got, want) {
		t.Errorf("calls:\n  %q\nwant\n  %q", got, want)
	}
	if !p.storeEmpty() {
		t.Error("the sandbox's state is left after its Delete")
	}
	// The exits are published by the watchers, so only the set is
	// checked here (service_test.go checks the order start, exit).
	topics := p.pub.wait(t, 9)
	slices.Sort(topics)
	wantTopics := []string{"/tasks/delete", "/tasks/delete", "/tasks/exec-added", "/tasks/exec-started",
		"/tasks/exit", "/tasks/exit", "/tasks/exit", "/tasks/start", "/tasks/start"}
	if !slices.Equal(topics, wantTopics) {
		t.Errorf("events %q, want %q", topics, wantTopics)
	}
}

// A dead VM is a dead pod: every process exits with 137, the sandbox is
// released at once (its VM stopped, no Shutdown asked of a guest that is
// gone), and the tasks can still be deleted.
func TestVMDeathEndsThePod(t *testing.T) {
	p := newFakePod(t)
	s, ctx := p.s, context.Background()
	if _, err := s.Start(ctx, &taskAPI.StartRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	p.vm.Exit()
	p.agent.Die() // the agent's connection ends with QEMU
	for _, id := range []string{"c1", "pod1"} {
		if got := p.wait(t, id, ""); got != exitVMLost {
			t.Errorf("%s's exit status %d, want %d", id, got, exitVMLost)
		}
	}
	waitFor(t, "the sandbox's release", p.storeEmpty)
	waitFor(t, "the VM's stop", func() bool { return p.calls.Count("vm.Stop") == 1 })
	if n := p.calls.Count("agent.Shutdown"); n != 0 {
		t.Errorf("Shutdown asked of a dead VM's agent: %q", p.calls.List())
	}
	for _, id := range []string{"c1", "pod1"} {
		if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: id}); err != nil {
			t.Errorf("Delete %s after the VM died: %v", id, err)
		}
	}
}

// The agent dying while QEMU runs: a call on a task fails with the
// connection's error (the edge makes it Unknown, "ttrpc: closed"); the
// processes it watched are lost (137); and a Delete whose RemoveContainer
// fails so goes on once QEMU's exit follows (vmDying).
func TestAgentDeath(t *testing.T) {
	p := newFakePod(t)
	s, ctx := p.s, context.Background()
	p.agent.Die()
	_, err := s.Pids(ctx, &taskAPI.PidsRequest{ID: "c1"})
	if !errors.Is(err, ttrpc.ErrClosed) {
		t.Errorf("Pids with the agent gone = %v, want ttrpc.ErrClosed", err)
	}
	if got := p.wait(t, "c1", ""); got != exitVMLost {
		t.Errorf("c1's exit status %d, want %d", got, exitVMLost)
	}
	time.AfterFunc(100*time.Millisecond, p.vm.Exit)
	if _, err := s.Delete(ctx, &taskAPI.DeleteRequest{ID: "c1"}); err != nil {
		t.Errorf("Delete after the agent then the VM died: %v", err)
	}
}

// The agent's error kinds reach the task API unchanged (agentclient.Err),
// and a failed Start is FailedPrecondition with the agent's message.
func TestAgentErrorKinds(t *testing.T) {
	p := newFakePod(t)
	s, ctx := p.s, context.Background()
	if _, err := s.Pids(ctx, &taskAPI.PidsRequest{ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	p.agent.Fail("ListProcesses", status.Error(codes.NotFound, "container c1 not found"))
	if _, err := s.Pids(ctx, &taskAPI.PidsRequest{ID: "c1"}); !errdefs.IsNotFound(err) {
		t.Errorf("Pids with the agent answering NotFound = %v", err)
	}
	p.agent.Fail("StartContainer", status.Error(codes.Internal, "exec format error"))
	_, err := s.Start(ctx, &taskAPI.StartRequest{ID: "c1"})
	if !errdefs.IsFailedPrecondition(errdefs.FromGRPC(err)) || !strings.Contains(err.Error(), "starting c1: exec format error") {
		t.Errorf("Start with the agent failing = %v", err)
	}
}

// A Delete whose caller stopped waiting (containerd's exit handler
// allows 10 s; a hot-unplug in a loaded guest can take longer) releases
// the container but keeps the task: containerd, which still has the
// container running, finds it stopped rather than gone (gone, its
// StopContainer did nothing and RemoveContainer refused: the seed race's
// "container is still running, to stop first"), and its next Delete
// forgets it.
func TestDeleteAfterCallerGaveUp(t *testing.T) {
	p := newFakePod(t)
	s := p.s
	p.agent.Exit("c1", "", 0)
	p.wait(t, "c1", "")
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	_, err := s.Delete(expired, &taskAPI.DeleteRequest{ID: "c1"})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Delete after its caller's deadline = %v, want DeadlineExceeded", err)
	}
	if p.agent.Running("c1") {
		t.Errorf("the container is still in the guest after the late Delete")
	}
	st, err := s.State(context.Background(), &taskAPI.StateRequest{ID: "c1"})
	if err != nil || st.Status != tasktypes.Status_STOPPED {
		t.Fatalf("State after the late Delete = %v, %v; want the task, stopped", st, err)
	}
	if _, err := s.Delete(context.Background(), &taskAPI.DeleteRequest{ID: "c1"}); err != nil {
		t.Fatalf("the second Delete: %v", err)
	}
	if _, err := s.State(context.Background(), &taskAPI.StateRequest{ID: "c1"}); !errdefs.IsNotFound(errdefs.FromGRPC(err)) {
		t.Errorf("State after the second Delete = %v, want NotFound", err)
	}
	if n := p.calls.Count("agent.RemoveContainer c1"); n != 1 {
		t.Errorf("the guest was asked to remove c1 %d times, want once", n)
	}
}

// Tasks kept after late Deletes do not hold the shim up: containerd,
// killed during the sandbox's Delete and started again, finds the
// shim's socket gone with the sandbox and never asks again. The shim
// must still exit once idle (it stayed forever: CI's
// TestContainerdKilledDuringDelete/VMGone).
func TestKeptTasksDoNotHoldTheShimUp(t *testing.T) {
	p := newFakePod(t)
	s := p.s
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for _, id := range []string{"c1", "pod1"} {
		p.agent.Exit(id, "", 0)
		p.wait(t, id, "")
		if _, err := s.Delete(expired, &taskAPI.DeleteRequest{ID: id}); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Delete %s after its caller's deadline = %v, want DeadlineExceeded", id, err)
		}
		s.exitIfIdle() // what the idle timer runs
		select {
		case <-p.sd.Done():
			if id == "c1" {
				t.Fatal("the shim exited while the sandbox task was not released")
			}
		default:
			if id == "pod1" {
				t.Fatal("the shim did not exit with every task released")
			}
		}
	}
	if _, err := s.State(context.Background(), &taskAPI.StateRequest{ID: "pod1"}); err != nil {
		t.Errorf("the kept sandbox task is gone before its second Delete: %v", err)
	}
}
