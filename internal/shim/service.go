package shim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/log"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
)

var _ taskAPI.TaskService = (*service)(nil)

// Idle exits: a shim that holds no task exits on its own, even if
// containerd never sends Shutdown.
const (
	idleAfterStart  = 60 * time.Second // started, no Create yet
	idleAfterDelete = 10 * time.Second // last task deleted
	// A Create that failed and left the shim with no task: its caller
	// (containerd) may be gone, as when it was killed mid-create, and
	// will not send Shutdown. Exiting soon lets containerd's restart find
	// a dead shim and clean its bundle with `shim delete`.
	idleAfterFailedCreate = 2 * time.Second
	rpcTimeout            = 30 * time.Second
	releaseTimeout        = 30 * time.Second
)

var empty = &ptypes.Empty{}

// service is the task API of one pod's shim.
type service struct {
	ctx    context.Context
	ns     string
	events *eventQueue
	sd     shutdown.Service
	// store holds every sandbox's state: runtime.state_dir of the
	// sandbox's configuration, set by its Create (tests set it first).
	// Written once, before the sandbox exists; read after.
	store *state.Store
	// newSandbox boots the VM; tests replace it.
	newSandbox func(ctx context.Context, o sandbox.Options) (*sandbox.Sandbox, error)

	// mu guards the fields below.
	mu    sync.Mutex
	sb    *sandbox.Sandbox
	tasks map[string]*task
	// creating counts Creates in flight: the shim is not idle while one
	// boots a VM or builds a container, however long that takes.
	creating int
	idle     *time.Timer
	stopped  bool // shutting down: no new tasks

	// address is this shim's socket (from the first task's bundle, the
	// server's working directory), "" if unknown.
	address string
}

func newService(ctx context.Context, pub shim.Publisher, sd shutdown.Service) (*service, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	s := &service{
		ctx:        ctx,
		ns:         ns,
		events:     newEventQueue(ns, pub),
		sd:         sd,
		newSandbox: sandbox.Boot,
		tasks:      map[string]*task{},
	}
	if a, err := shim.ReadAddress("address"); err == nil {
		s.address = a
	}
	s.idle = time.AfterFunc(idleAfterStart, s.exitIfIdle)
	sd.RegisterCallback(func(context.Context) error {
		s.mu.Lock()
		s.stopped = true
		sb := s.sb
		s.mu.Unlock()
		var err error
		if sb != nil {
			err = s.stopSandbox(sb)
		}
		s.events.close()
		pub.Close()
		return err
	})
	return s, nil
}

func (s *service) exitIfIdle() {
	s.mu.Lock()
	n := s.liveTasks() + s.creating
	s.mu.Unlock()
	if n == 0 {
		log.G(s.ctx).Info("no task left; shim exiting")
		// containerd removes the socket only when it asked for the
		// exit (Shutdown); on our own we remove it ourselves. The
		// listener is ours until the process ends, so nothing can
		// take the path in between.
		if s.address != "" {
			if err := shim.RemoveSocket(s.address); err != nil && !errors.Is(err, fs.ErrNotExist) {
				log.G(s.ctx).WithError(err).Warn("removing the shim socket")
			}
		}
		s.sd.Shutdown()
	}
}

// liveTasks counts the tasks not yet released; s.mu held.
func (s *service) liveTasks() int {
	n := 0
	for _, t := range s.tasks {
		if !t.released.Load() {
			n++
		}
	}
	return n
}

// markReleased records that t's resources are released: t no longer
// holds the shim up, which idles out once no live task is left (a
// released task may still be kept for containerd's next Delete).
func (s *service) markReleased(t *task) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.released.Store(true)
	if s.liveTasks() == 0 {
		s.idle.Reset(idleAfterDelete)
	}
}

func (s *service) getTask(id string) (*task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	if !ok {
		return nil, errdefs.ToGRPCf(errdefs.ErrNotFound, "task %s not found", id)
	}
	return t, nil
}

func (s *service) getProc(id, execID string) (*task, *proc, error) {
	t, err := s.getTask(id)
	if err != nil {
		return nil, nil, err
	}
	p, ok := t.proc(execID)
	if !ok {
		return nil, nil, errdefs.ToGRPCf(errdefs.ErrNotFound, "process %s of task %s not found", execID, id)
	}
	return t, p, nil
}

func (s *service) agent() (sandbox.Agent, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sb == nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "the pod's VM is not running")
	}
	return s.sb.Agent(), nil
}

func (s *service) logger(id string) *log.Entry {
	s.mu.Lock()
	sid := ""
	if s.sb != nil {
		sid = s.sb.ID
	}
	s.mu.Unlock()
	return log.G(s.ctx).WithField("sandbox", sid).WithField("container", id)
}

// createState creates the sandbox's state, owned by this process. A
// state left by an owner that is gone (a crashed shim whose `shim delete`
// has not run yet) is released first; one whose owner runs is refused.
func (s *service) createState(ctx context.Context, sid, bundle string) (*state.Handle, error) {
	init := state.Sandbox{Namespace: s.ns, Bundle: bundle}
	h, err := s.store.Create(sid, init)
	if !errors.Is(err, fs.ErrExist) {
		return s.recordSocket(h, err)
	}
	old, oerr := s.store.OpenContext(ctx, sid)
	if oerr == nil {
		st := old.State()
		if st.ShimPid != os.Getpid() && state.ProcessAlive(st.ShimPid, st.ShimStartTime) {
			old.Close()
			return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "sandbox %s is owned by shim %d", sid, st.ShimPid)
		}
		log.G(s.ctx).WithField("sandbox", sid).Warn("releasing what an earlier shim of this sandbox left")
		oerr = sandbox.Release(ctx, old, "")
		old.Close()
	}
	if oerr != nil && !errors.Is(oerr, fs.ErrNotExist) {
		return nil, fmt.Errorf("releasing the earlier state of sandbox %s: %w", sid, oerr)
	}
	return s.recordSocket(s.store.Create(sid, init))
}

// recordSocket records this shim's socket in the sandbox's new state, so
// that whoever releases the sandbox — `hull gc` after a SIGKILLed shim
// with containerd gone included — removes it through the one release
// path. Removing the path does not disturb connections already made.
func (s *service) recordSocket(h *state.Handle, err error) (*state.Handle, error) {
	if err != nil || s.address == "" {
		return h, err
	}
	path, ok := strings.CutPrefix(s.address, "unix://")
	if !ok {
		return h, nil // not a socket file (an abstract or vsock address)
	}
	if err := h.Record(state.Resource{Kind: state.KindSocket, Key: path, Path: path, Data: map[string]string{"role": "shim"}}); err != nil {
		h.Close()
		return nil, fmt.Errorf("recording the shim socket %s: %w", path, err)
	}
	return h, nil
}

// removeGuestContainer removes container id from the guest, bounded by
// rpcTimeout. A closed connection is returned as such (the VM may be
// dying: see vmDying).
func removeGuestContainer(sb *sandbox.Sandbox, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	return sb.RemoveContainer(ctx, id)
}

// Start starts a created task's init, or an exec added with Exec.
func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	t, p, err := s.getProc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	p.startMu.Lock()
	defer p.startMu.Unlock()
	p.mu.Lock()
	if p.started {
		p.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process %s already started", execOrContainer(r.ID, r.ExecID))
	}
	p.started = true
	p.mu.Unlock()
	if p.hasExited() {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process %s has exited", execOrContainer(r.ID, r.ExecID))
	}
	rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	if r.ExecID == "" {
		if err = t.failpoints.Check(failpoint.ContainerStart); err == nil {
			_, err = c.StartContainer(rctx, &agent.ContainerRequest{ContainerId: r.ID})
		}
	} else {
		var resp *agent.ExecProcessResponse
		resp, err = c.ExecProcess(rctx, &agent.ExecProcessRequest{ContainerId: r.ID, ExecId: r.ExecID, Process: p.spec, Stdin: p.io.stdin != ""})
		if err == nil {
			p.mu.Lock()
			p.pid = resp.Pid
			p.mu.Unlock()
			p.startIO(s.ctx, c)
			go s.watch(t, p)
		}
	}
	if err != nil {
		p.mu.Lock()
		p.startFailed = true
		p.mu.Unlock()
		if r.ExecID != "" {
			// Never started: nothing to wait for in the guest.
			ee, ok := agentclient.AsExecError(err)
			status := uint32(126)
			if ok {
				status = uint32(ee.Code)
			}
			p.setExited(status, time.Now())
		}
		s.logger(r.ID).WithError(err).WithField("exec", r.ExecID).Warn("start failed")
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "starting %s: %s", execOrContainer(r.ID, r.ExecID), agentclient.Message(err))
	}
	p.mu.Lock()
	pid := p.pid
	p.mu.Unlock()
	if r.ExecID == "" {
		s.events.send(&eventstypes.TaskStart{ContainerID: r.ID, Pid: pid})
		if t.isSandbox {
			s.armGuestPanic(t)
		}
	} else {
		s.events.send(&eventstypes.TaskExecStarted{ContainerID: r.ID, ExecID: r.ExecID, Pid: pid})
	}
	return &taskAPI.StartResponse{Pid: pid}, nil
}

// Delete removes an exited (or never started) process; for a task's init
// it removes the container from the guest and releases its mounts, and
// for the sandbox task it stops the VM.
func (s *service) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	t, p, err := s.getProc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	running := p.started && !p.startFailed
	pid := p.pid
	p.mu.Unlock()
	if running && !p.hasExited() {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "process %s is running; kill it first", execOrContainer(r.ID, r.ExecID))
	}
	if r.ExecID != "" {
		p.closeIO()
		t.mu.Lock()
		delete(t.execs, r.ExecID)
		t.mu.Unlock()
		status, at := p.status()
		return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
	}
	t.deleteMu.Lock()
	defer t.deleteMu.Unlock()
	if !t.released.Load() {
		if err := s.releaseTask(ctx, t); err != nil {
			return nil, errdefs.ToGRPC(err)
		}
		s.markReleased(t)
	}
	if err := ctx.Err(); err != nil {
		// containerd stopped waiting (its exit handler allows 10 s; a
		// disk's hot-unplug in a loaded guest can take longer) and will
		// delete again. Forgotten now, the task would be gone while CRI
		// still has the container running: StopContainer would find no
		// task and do nothing, RemoveContainer would refuse. Kept, it
		// is found stopped, and the next Delete forgets it. It does not
		// hold the shim up: a containerd that restarted meanwhile may
		// never ask again (it finds the shim's socket gone with the
		// sandbox and cleans up as after a dead shim).
		s.logger(r.ID).WithError(err).Warn("released the task after containerd stopped waiting; keeping it until containerd deletes it again")
		return nil, errdefs.ToGRPC(err)
	}
	s.forgetTask(t)
	// A created process that was never started is gone now.
	s.reportExit(t, p, exitVMLost, time.Now())
	status, at := p.status()
	s.events.send(&eventstypes.TaskDelete{ContainerID: r.ID, ID: r.ID, Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)})
	return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}
