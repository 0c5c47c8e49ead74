package shim

import (
	"context"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/rollback"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
)

// createCall is one Create: what it learnt from the request and what it
// acquired so far (undo, released on failure).
type createCall struct {
	r       *taskAPI.CreateTaskRequest
	spec    *specs.Spec
	sid     string
	pause   bool          // the sandbox task (the pod's pause container)
	fps     failpoint.Set // the sandbox's
	cfps    failpoint.Set // the container steps'
	logger  *log.Entry
	undo    rollback.Stack
	h       *state.Handle // the sandbox's state, locked for this call
	sb      *sandbox.Sandbox
	newTask *task
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
	c := &createCall{r: r, spec: spec}
	c.sid, c.pause = sandboxOf(r.ID, spec.Annotations)
	// Ids become path components on the host: checked before any is made.
	for _, id := range []string{r.ID, c.sid} {
		if err := state.ValidID(id); err != nil {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "creating task %q: %v", r.ID, err)
		}
	}
	c.logger = log.G(s.ctx).WithField("sandbox", c.sid).WithField("container", r.ID)
	c.fps = failpoint.FromAnnotations(spec.Annotations)
	c.cfps = c.fps
	if c.pause {
		c.cfps = c.fps.Prefixed(failpoint.SandboxPrefix)
	}
	done, err := s.admit(r.ID)
	if err != nil {
		return nil, err
	}
	defer done()
	defer func() { s.endCreate(c, retErr) }()

	if c.pause {
		err = s.createSandbox(ctx, c)
	} else {
		err = s.joinSandbox(ctx, c)
	}
	if err != nil {
		return nil, err
	}
	pid, err := s.createContainer(ctx, c)
	if err != nil {
		return nil, err
	}
	s.register(c)
	s.events.send(&eventstypes.TaskCreate{
		ContainerID: r.ID,
		Bundle:      r.Bundle,
		Rootfs:      r.Rootfs,
		IO:          &eventstypes.TaskIO{Stdin: r.Stdin, Stdout: r.Stdout, Stderr: r.Stderr, Terminal: r.Terminal},
		Pid:         pid,
	})
	c.logger.WithField("pid", pid).Info("container created")
	return &taskAPI.CreateTaskResponse{Pid: pid}, nil
}

// admit counts a Create in flight (the shim is not idle while it runs)
// unless the shim is shutting down or the task exists; done ends it.
func (s *service) admit(id string) (done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "shim is shutting down")
	}
	if _, ok := s.tasks[id]; ok {
		return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "task %s", id)
	}
	s.creating++
	return func() {
		s.mu.Lock()
		s.creating--
		s.mu.Unlock()
	}, nil
}

// endCreate rolls a failed Create back and unlocks the sandbox's state.
// A failure that leaves the shim with no task arms a short idle exit:
// its caller may be a killed containerd that will not send Shutdown.
func (s *service) endCreate(c *createCall, err error) {
	if err != nil {
		if uerr := c.undo.Unwind(); uerr != nil {
			c.logger.WithError(uerr).Error("rolling back failed create")
		}
		s.mu.Lock()
		if len(s.tasks) == 0 {
			s.idle.Reset(idleAfterFailedCreate)
		}
		s.mu.Unlock()
	}
	if c.h != nil {
		c.h.Close()
	}
}

// createSandbox creates the sandbox's state (owned by this process) and
// boots the pod's VM with the pod's configuration.
func (s *service) createSandbox(ctx context.Context, c *createCall) error {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb != nil {
		return errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "sandbox %s already has a VM", sb.ID)
	}
	if err := refuseHostNetwork(c.sid, c.spec); err != nil {
		return err
	}
	cfg, src, err := s.loadConfig(c.r, c.logger)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.store == nil {
		s.store = &state.Store{Root: cfg.Runtime.StateDir}
	}
	root := s.store.Root
	s.mu.Unlock()
	// `shim delete` runs without the configuration: it finds the state
	// root in the bundle, written before anything is recorded.
	if err := writeStateRoot(c.r.Bundle, root); err != nil {
		return err
	}
	if c.h, err = s.createState(ctx, c.sid, c.r.Bundle); err != nil {
		return err
	}
	h := c.h
	c.undo.Add("sandbox", func() error {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		return sandbox.Release(rctx, h, "")
	})
	if err := c.fps.Check(failpoint.StateCreate); err != nil {
		return err
	}
	c.sb, err = s.bootSandbox(ctx, cfg, src, h, c.fps, c.sid, c.spec.Hostname, specNetns(c.spec), specCgroupsPath(c.spec), c.spec.Annotations)
	if err != nil {
		return err
	}
	c.undo.Add("sandbox VM", c.sb.PowerOff)
	c.undo.Add("port forwarding", s.startPortForward(c.sb, specNetns(c.spec), c.logger))
	return nil
}

// joinSandbox locks the state of the pod's sandbox, whose VM this shim
// runs, for a later container of the pod.
func (s *service) joinSandbox(ctx context.Context, c *createCall) error {
	s.mu.Lock()
	c.sb = s.sb
	s.mu.Unlock()
	if c.sb == nil || c.sb.ID != c.sid {
		return errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: sandbox %s has no VM in this shim", c.r.ID, c.sid)
	}
	var err error
	if c.h, err = s.store.OpenContext(ctx, c.sid); err != nil {
		return errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "container %s: %v", c.r.ID, err)
	}
	return writeStateRoot(c.r.Bundle, c.h.Root())
}

// createContainer has the sandbox build the container (host work and
// guest container) and connects its stdio; each step's undo sits next to
// it.
func (s *service) createContainer(ctx context.Context, c *createCall) (uint32, error) {
	r, h, sb := c.r, c.h, c.sb
	// The container's host resources: released on failure by the one
	// release path, scoped to the container.
	c.undo.Add("container "+r.ID, func() error {
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		return sandbox.Release(rctx, h, r.ID)
	})
	pid, err := sb.CreateContainer(ctx, h, sandbox.ContainerRequest{
		ID: r.ID, Bundle: r.Bundle, Spec: c.spec, Rootfs: r.Rootfs, Stdin: r.Stdin != "", Pause: c.pause, Failpoints: c.cfps,
	})
	if err != nil {
		return 0, err
	}
	c.undo.Add("guest container", func() error { return removeGuestContainer(sb, r.ID) })
	if err := c.cfps.Check(failpoint.GuestCreate); err != nil {
		return 0, err
	}
	t := &task{id: r.ID, sandboxID: c.sid, bundle: r.Bundle, isSandbox: c.pause, failpoints: c.cfps, sandboxFailpoints: c.fps, execs: map[string]*proc{}}
	t.init = newProc(r.ID, "", stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal})
	t.init.pid = pid
	t.init.startIO(s.ctx, sb.Agent())
	c.undo.Add("stdio", func() error { t.init.closeIO(); return nil })
	if c.pause {
		if err := h.SetPhase(state.PhaseRunning); err != nil {
			return 0, err
		}
	}
	c.newTask = t
	return pid, nil
}

// register makes the created task (and for the sandbox task, the VM)
// the shim's, keeps what Create acquired, and starts the watchers: a
// created process can die too (killed before Start, or the VM lost).
func (s *service) register(c *createCall) {
	t := c.newTask
	s.mu.Lock()
	if c.pause {
		s.sb = c.sb
	}
	s.tasks[t.id] = t
	s.idle.Stop()
	s.mu.Unlock()
	c.undo.Release()
	go s.watch(t, t.init)
	if c.pause {
		go s.watchVM(c.sb)
	}
}
