package shim

import (
	"context"
	"sync"
	"testing"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/events"
	"github.com/containerd/containerd/namespaces"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/sandbox"
)

// fakePublisher records what is published, with the namespace.
type fakePublisher struct {
	mu     sync.Mutex
	topics []string
	ns     []string
	got    chan struct{}
}

func newFakePublisher() *fakePublisher { return &fakePublisher{got: make(chan struct{}, 100)} }

func (f *fakePublisher) Publish(ctx context.Context, topic string, _ events.Event) error {
	ns, _ := namespaces.Namespace(ctx)
	f.mu.Lock()
	f.topics = append(f.topics, topic)
	f.ns = append(f.ns, ns)
	f.mu.Unlock()
	f.got <- struct{}{}
	return nil
}

func (f *fakePublisher) Close() error { return nil }

func (f *fakePublisher) wait(t *testing.T, n int) []string {
	t.Helper()
	for range n {
		select {
		case <-f.got:
		case <-time.After(5 * time.Second):
			t.Fatalf("timed out waiting for %d events", n)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ns := range f.ns {
		if ns != "k8s.io" {
			t.Errorf("event published with namespace %q", ns)
		}
	}
	return append([]string(nil), f.topics...)
}

type fakeShutdown struct {
	once sync.Once
	done chan struct{}
}

func (f *fakeShutdown) Shutdown()                                    { f.once.Do(func() { close(f.done) }) }
func (f *fakeShutdown) Done() <-chan struct{}                        { return f.done }
func (f *fakeShutdown) Err() error                                   { return nil }
func (f *fakeShutdown) RegisterCallback(func(context.Context) error) {}
func newFakeShutdown() *fakeShutdown                                 { return &fakeShutdown{done: make(chan struct{})} }

func testService(t *testing.T) (*service, *fakePublisher, *fakeShutdown) {
	t.Helper()
	pub, sd := newFakePublisher(), newFakeShutdown()
	s, err := newService(namespaces.WithNamespace(context.Background(), "k8s.io"), pub, sd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.idle.Stop(); s.events.close() })
	return s, pub, sd
}

func addTask(s *service, id string) *task {
	t := &task{id: id, bundle: "/b/" + id, execs: map[string]*proc{}}
	t.init = newProc(id, "", stdio{})
	t.init.pid = 7
	s.mu.Lock()
	s.tasks[id] = t
	s.mu.Unlock()
	return t
}

func TestSandboxOf(t *testing.T) {
	for _, tc := range []struct {
		id        string
		ann       map[string]string
		sid       string
		isSandbox bool
	}{
		{"ctr", nil, "ctr", true},
		{"pod", map[string]string{annotationSandboxID: "pod", sandbox.AnnotationContainerType: "sandbox"}, "pod", true},
		{"c1", map[string]string{annotationSandboxID: "pod", sandbox.AnnotationContainerType: "container"}, "pod", false},
	} {
		sid, is := sandboxOf(tc.id, tc.ann)
		if sid != tc.sid || is != tc.isSandbox {
			t.Errorf("sandboxOf(%s) = %s, %v; want %s, %v", tc.id, sid, is, tc.sid, tc.isSandbox)
		}
	}
}

// TaskStart is queued under startMu; an exit that arrives meanwhile is
// published after it.
func TestStartBeforeExit(t *testing.T) {
	s, pub, _ := testService(t)
	tk := addTask(s, "c1")
	p := tk.init
	p.startMu.Lock()
	exited := make(chan struct{})
	go func() {
		s.reportExit(tk, p, 3, time.Now())
		close(exited)
	}()
	time.Sleep(50 * time.Millisecond) // the exit is waiting for startMu
	p.started = true
	s.events.send(&eventstypes.TaskStart{ContainerID: "c1", Pid: 7})
	p.startMu.Unlock()
	<-exited
	got := pub.wait(t, 2)
	if got[0] != "/tasks/start" || got[1] != "/tasks/exit" {
		t.Errorf("events = %v, want start then exit", got)
	}
}

func TestWaitKillStateAfterExit(t *testing.T) {
	s, pub, _ := testService(t)
	tk := addTask(s, "c1")
	tk.init.started = true
	ctx := context.Background()

	st, err := s.State(ctx, &taskAPI.StateRequest{ID: "c1"})
	if err != nil || st.Status != tasktypes.Status_RUNNING {
		t.Fatalf("State = %v, %v", st, err)
	}
	waited := make(chan *taskAPI.WaitResponse, 1)
	go func() {
		r, err := s.Wait(ctx, &taskAPI.WaitRequest{ID: "c1"})
		if err != nil {
			t.Error(err)
		}
		waited <- r
	}()
	s.reportExit(tk, tk.init, 42, time.Unix(100, 0))
	s.reportExit(tk, tk.init, 1, time.Now()) // a second report is ignored
	select {
	case r := <-waited:
		if r.ExitStatus != 42 || r.ExitedAt.AsTime() != time.Unix(100, 0).UTC() {
			t.Errorf("Wait = %v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after the exit")
	}
	if got := pub.wait(t, 1); len(got) != 1 || got[0] != "/tasks/exit" {
		t.Errorf("events = %v, want one exit", got)
	}
	_, err = s.Kill(ctx, &taskAPI.KillRequest{ID: "c1", Signal: 9})
	if !errdefs.IsNotFound(errdefs.FromGRPC(err)) {
		t.Errorf("Kill after exit = %v, want NotFound", err)
	}
	st, err = s.State(ctx, &taskAPI.StateRequest{ID: "c1"})
	if err != nil || st.Status != tasktypes.Status_STOPPED || st.ExitStatus != 42 {
		t.Errorf("State after exit = %v, %v", st, err)
	}
	if _, err := s.State(ctx, &taskAPI.StateRequest{ID: "nope"}); !errdefs.IsNotFound(errdefs.FromGRPC(err)) {
		t.Errorf("State of unknown task = %v", err)
	}
}

func TestFailedStartPublishesNoExit(t *testing.T) {
	s, pub, _ := testService(t)
	tk := addTask(s, "c1")
	tk.init.started, tk.init.startFailed = true, true
	s.reportExit(tk, tk.init, 127, time.Now())
	s.events.send(&eventstypes.TaskDelete{ContainerID: "c1"})
	if got := pub.wait(t, 1); got[0] != "/tasks/delete" {
		t.Errorf("events = %v, want only the delete", got)
	}
}

func TestShutdownOnlyWithoutTasks(t *testing.T) {
	s, _, sd := testService(t)
	addTask(s, "c1")
	if _, err := s.Shutdown(context.Background(), &taskAPI.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sd.done:
		t.Fatal("shut down while holding a task")
	default:
	}
	s.mu.Lock()
	delete(s.tasks, "c1")
	s.mu.Unlock()
	s.Shutdown(context.Background(), &taskAPI.ShutdownRequest{})
	select {
	case <-sd.done:
	default:
		t.Fatal("Shutdown with no task did not shut down")
	}
}

func TestIdleExit(t *testing.T) {
	s, _, sd := testService(t)
	s.exitIfIdle()
	select {
	case <-sd.done:
	default:
		t.Fatal("an idle shim did not exit")
	}
}

func TestCheckpointUnimplemented(t *testing.T) {
	s, _, _ := testService(t)
	_, err := s.Checkpoint(context.Background(), &taskAPI.CheckpointTaskRequest{ID: "c1"})
	if !errdefs.IsNotImplemented(errdefs.FromGRPC(err)) {
		t.Errorf("Checkpoint = %v", err)
	}
}

func TestMetrics(t *testing.T) {
	m := metrics(&agent.StatsContainerResponse{CpuUsageNs: 5000, MemoryUsageBytes: 100, MemoryWorkingSetBytes: 60, OomKills: 1, PidsCurrent: 2})
	if m.CPU.UsageUsec != 5 || m.Memory.Usage != 100 || m.Memory.InactiveFile != 40 || m.MemoryEvents.OomKill != 1 || m.Pids.Current != 2 {
		t.Errorf("metrics = %v", m)
	}
}
