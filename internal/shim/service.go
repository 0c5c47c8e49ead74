package shim

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	"github.com/containerd/ttrpc"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/rollback"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
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
	// store holds every sandbox's state (/run/hull); tests point it
	// elsewhere.
	store *state.Store
	// newSandbox boots the VM; tests replace it.
	newSandbox func(ctx context.Context, o sandbox.Options) (*sandbox.Sandbox, error)

	// mu guards the fields below.
	mu      sync.Mutex
	sb      *sandbox.Sandbox
	tasks   map[string]*task
	idle    *time.Timer
	stopped bool // shutting down: no new tasks
	// creating counts Creates in progress: a shim booting its VM is not
	// idle, however long the boot takes.
	creating int

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
		store:      &state.Store{Root: sandbox.DefaultRunDir},
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

// RegisterTTRPC makes service a ttrpc plugin of the shim package.
func (s *service) RegisterTTRPC(server *ttrpc.Server) error {
	taskAPI.RegisterTaskService(server, s)
	return nil
}

func (s *service) exitIfIdle() {
	s.mu.Lock()
	n := len(s.tasks) + s.creating
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

func (s *service) agent() (*agentclient.Client, error) {
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

// Create boots the VM for the sandbox task, and builds the container in
// the guest from the bundle's spec and the rootfs containerd passes.
// Every host resource is recorded in the sandbox's state before it is
// acquired; a failed Create releases what it recorded (the container's
// resources, and for the sandbox task the whole sandbox) through the one
// release path, so the call leaves nothing behind.
func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, retErr error) {
	spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "%v", err)
	}
	sid, isSandbox := sandboxOf(r.ID, spec.Annotations)
	logger := log.G(s.ctx).WithField("sandbox", sid).WithField("container", r.ID)
	fps := failpoint.FromAnnotations(spec.Annotations)
	cfps := fps // the container steps
	if isSandbox {
		cfps = fps.Prefixed(failpoint.SandboxPrefix)
	}
	var (
		undo rollback.Stack
		h    *state.Handle // the sandbox's state, locked for this call
	)
	defer func() {
		if retErr != nil {
			if err := undo.Unwind(); err != nil {
				logger.WithError(err).Error("rolling back failed create")
			}
			s.mu.Lock()
			if len(s.tasks) == 0 && s.creating == 0 {
				s.idle.Reset(idleAfterFailedCreate)
			}
			s.mu.Unlock()
		}
		if h != nil {
			h.Close()
		}
	}()

	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "shim is shutting down")
	}
	if _, ok := s.tasks[r.ID]; ok {
		s.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "task %s", r.ID)
	}
	sb := s.sb
	s.creating++
	s.idle.Stop()
	s.mu.Unlock()
	// Runs before the rollback above, which restarts the idle timer when
	// no task and no other Create is left.
	defer func() {
		s.mu.Lock()
		s.creating--
		s.mu.Unlock()
	}()

	if isSandbox {
		if sb != nil {
			return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "sandbox %s already has a VM", sb.ID)
		}
		// This process (the shim server) owns the state: Create records
		// its pid and start time.
		if h, err = s.createState(ctx, sid, r.Bundle); err != nil {
			return nil, err
		}
		undo.Add("sandbox", func() error {
			rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			defer cancel()
			return sandbox.Release(rctx, h, "")
		})
		if err := fps.Check(failpoint.StateCreate); err != nil {
			return nil, err
		}
		sb, err = s.bootSandbox(ctx, r, h, fps, sid, spec.Hostname, specNetns(spec), spec.Annotations)
		if err != nil {
			return nil, err
		}
		undo.Add("sandbox VM", sb.PowerOff)
	} else {
		if sb == nil || sb.ID != sid {
			return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: sandbox %s has no VM in this shim", r.ID, sid)
		}
		if h, err = s.store.OpenContext(ctx, sid); err != nil {
			return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: %v", r.ID, err)
		}
	}
	// The container's host resources: released on failure by the one
	// release path, scoped to the container.
	undo.Add("container "+r.ID, func() error {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		return sandbox.Release(rctx, h, r.ID)
	})
	// Host devices: opened and checked now, used by descriptor from here.
	devs, err := openDevices(h, sb, spec, r.ID, logger)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: %v", r.ID, err)
	}

	// The rootfs: mounted like runc's shim does, then bound into the
	// shared directory where the guest sees it.
	t := &task{id: r.ID, sandboxID: sid, bundle: r.Bundle, isSandbox: isSandbox, failpoints: cfps, sandboxFailpoints: fps, execs: map[string]*proc{}}
	rootfs := filepath.Join(r.Bundle, "rootfs")
	if len(r.Rootfs) > 0 {
		if err := storage.MountRootfs(h, r.ID, r.Rootfs, rootfs); err != nil {
			return nil, err
		}
	} else if spec.Root != nil && spec.Root.Path != "" {
		rootfs = spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(r.Bundle, rootfs)
		}
	}
	if err := cfps.Check(failpoint.RootfsMount); err != nil {
		return nil, err
	}
	plan, err := storage.GuestSpec(spec, r.ID, sb.SharedDir(), sb.Hostname)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "%v", err)
	}
	for _, d := range plan.Dropped {
		logger.WithField("dropped", d).Debug("spec entry not passed to the guest")
	}
	if err := storage.MakeContainerDir(h, sb.SharedDir(), r.ID); err != nil {
		return nil, err
	}
	if err := storage.BindInto(h, r.ID, rootfs, plan.RootfsTarget, false); err != nil {
		return nil, fmt.Errorf("sharing the rootfs: %w", err)
	}
	if err := cfps.Check(failpoint.ShareRootfs); err != nil {
		return nil, err
	}
	for _, b := range plan.Binds {
		if err := storage.BindInto(h, r.ID, b.Source, b.Target, b.ReadOnly); err != nil {
			return nil, fmt.Errorf("sharing mount %s: %w", b.Source, err)
		}
	}
	if err := cfps.Check(failpoint.ShareMounts); err != nil {
		return nil, err
	}
	specJSON, err := jsonMarshal(plan.Spec)
	if err != nil {
		return nil, err
	}
	var storages []*agent.Storage
	if isSandbox {
		storages = sandboxStorages()
	}
	c := sb.Agent()
	cctx, cancel := context.WithTimeout(ctx, s.createTimeout(sb))
	defer cancel()
	agentDevs, err := attachDevices(cctx, sb, devs, r.ID, cfps, logger)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: %v", r.ID, err)
	}
	resp, err := c.CreateContainer(cctx, &agent.CreateContainerRequest{
		ContainerId: r.ID,
		OciSpec:     specJSON,
		Storages:    storages,
		Stdin:       r.Stdin != "",
		Devices:     agentDevs,
	})
	if err != nil {
		return nil, fmt.Errorf("creating container %s in the VM: %s", r.ID, agentclient.Message(err))
	}
	undo.Add("guest container", func() error { return removeGuestContainer(c, r.ID) })
	if err := cfps.Check(failpoint.GuestCreate); err != nil {
		return nil, err
	}

	t.init = newProc(r.ID, "", stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal})
	t.init.pid = resp.Pid
	t.init.startIO(s.ctx, c)
	undo.Add("stdio", func() error { t.init.closeIO(); return nil })
	if isSandbox {
		if err := h.SetPhase(state.PhaseRunning); err != nil {
			return nil, err
		}
	}

	s.mu.Lock()
	if isSandbox {
		s.sb = sb
	}
	s.tasks[r.ID] = t
	s.idle.Stop()
	s.mu.Unlock()
	undo.Release()
	// The exit watcher runs from Create: a created process can die too
	// (killed before Start, or the VM lost).
	go s.watch(t, t.init)
	if isSandbox {
		go s.watchVM(sb)
	}
	s.events.send(&eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Pid:         resp.Pid,
	})
	logger.WithField("pid", resp.Pid).Info("container created")
	return &taskAPI.CreateTaskResponse{Pid: resp.Pid}, nil
}

// createState creates the sandbox's state, owned by this process. A
// state left by an owner that is gone (a crashed shim whose `shim delete`
// has not run yet) is released first; one whose owner runs is refused.
func (s *service) createState(ctx context.Context, sid, bundle string) (*state.Handle, error) {
	init := state.Sandbox{Namespace: s.ns, Bundle: bundle}
	h, err := s.store.Create(sid, init)
	if !errors.Is(err, fs.ErrExist) {
		return h, err
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
	return s.store.Create(sid, init)
}

// sandboxStorages are mounted in the guest with the sandbox container,
// before anything else: the shared directory and the pod's /dev/shm.
func sandboxStorages() []*agent.Storage {
	return []*agent.Storage{
		{Source: storage.SharedTag, Fstype: "9p", Options: []string{"trans=virtio", "version=9p2000.L", "msize=512000", "cache=mmap"}, MountPoint: storage.GuestSharedDir},
		{Source: "shm", Fstype: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=65536k"}, MountPoint: storage.GuestShmDir},
	}
}

func removeGuestContainer(c *agentclient.Client, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	defer cancel()
	_, err := c.RemoveContainer(ctx, &agent.RemoveContainerRequest{ContainerId: id, Force: true})
	switch {
	case err == nil || agentclient.IsNotFound(err):
		return nil
	case errors.Is(err, ttrpc.ErrClosed):
		return fmt.Errorf("removing container %s in the VM: %w", id, err)
	default:
		return fmt.Errorf("removing container %s in the VM: %s", id, agentclient.Message(err))
	}
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
	if err := s.releaseTask(ctx, t); err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	// A created process that was never started is gone now.
	s.reportExit(t, p, exitVMLost, time.Now())
	status, at := p.status()
	s.events.send(&eventstypes.TaskDelete{ContainerID: r.ID, ID: r.ID, Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)})
	return &taskAPI.DeleteResponse{Pid: pid, ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

// agentErr converts an agent error to the task API's status at the edge.
func agentErr(err error) error {
	if agentclient.IsNotFound(err) {
		return errdefs.ToGRPCf(errdefs.ErrNotFound, "%s", agentclient.Message(err))
	}
	return fmt.Errorf("%s", agentclient.Message(err))
}
