// The task API calls that act on a running task: exec, signals, terminal,
// stdio, state, pids, stats, resources, pause, wait and shutdown.

package shim

import (
	"context"
	"os"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/protobuf"
	ptypes "github.com/containerd/containerd/protobuf/types"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
)

// Exec adds a process to a running task; Start runs it.
func (s *service) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*ptypes.Empty, error) {
	t, err := s.getTask(r.ID)
	if err != nil {
		return nil, err
	}
	if t.init.hasExited() {
		return nil, errdefs.ToGRPCf(errdefs.ErrFailedPrecondition, "task %s has exited", r.ID)
	}
	t.mu.Lock()
	if _, ok := t.execs[r.ExecID]; ok {
		t.mu.Unlock()
		return nil, errdefs.ToGRPCf(errdefs.ErrAlreadyExists, "exec %s", r.ExecID)
	}
	p := newProc(r.ID, r.ExecID, stdio{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr, terminal: r.Terminal})
	// The Any holds the OCI process as JSON, which is what the agent takes.
	p.spec = r.Spec.GetValue()
	t.execs[r.ExecID] = p
	t.mu.Unlock()
	s.events.send(&eventstypes.TaskExecAdded{ContainerID: r.ID, ExecID: r.ExecID})
	return empty, nil
}

func (s *service) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*ptypes.Empty, error) {
	if _, _, err := s.getProc(r.ID, r.ExecID); err != nil {
		return nil, err
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	if _, err := c.ResizeTTY(ctx, &agent.ResizeTTYRequest{ContainerId: r.ID, ExecId: r.ExecID, Width: r.Width, Height: r.Height}); err != nil {
		return nil, agentclient.Err(err)
	}
	return empty, nil
}

func (s *service) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	t, p, err := s.getProc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	st := tasktypes.Status_CREATED
	switch {
	case p.hasExited():
		st = tasktypes.Status_STOPPED
	case p.paused:
		st = tasktypes.Status_PAUSED
	case p.started:
		st = tasktypes.Status_RUNNING
	}
	resp := &taskAPI.StateResponse{
		ID:         r.ID,
		ExecID:     r.ExecID,
		Bundle:     t.bundle,
		Pid:        p.pid,
		Status:     st,
		Stdin:      p.io.stdin,
		Stdout:     p.io.stdout,
		Stderr:     p.io.stderr,
		Terminal:   p.io.terminal,
		ExitStatus: p.exitStatus,
	}
	if !p.exitedAt.IsZero() {
		resp.ExitedAt = protobuf.ToTimestamp(p.exitedAt)
	}
	p.mu.Unlock()
	return resp, nil
}

func (s *service) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*ptypes.Empty, error) {
	return s.freeze(ctx, r.ID, true)
}

func (s *service) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*ptypes.Empty, error) {
	return s.freeze(ctx, r.ID, false)
}

func (s *service) freeze(ctx context.Context, id string, frozen bool) (*ptypes.Empty, error) {
	t, err := s.getTask(id)
	if err != nil {
		return nil, err
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	req := &agent.ContainerRequest{ContainerId: id}
	if frozen {
		_, err = c.PauseContainer(ctx, req)
	} else {
		_, err = c.ResumeContainer(ctx, req)
	}
	if err != nil {
		return nil, agentclient.Err(err)
	}
	t.init.mu.Lock()
	t.init.paused = frozen
	t.init.mu.Unlock()
	if frozen {
		s.events.send(&eventstypes.TaskPaused{ContainerID: id})
	} else {
		s.events.send(&eventstypes.TaskResumed{ContainerID: id})
	}
	return empty, nil
}

// Kill signals a process, or with All every process of the task. A
// process that has exited is NotFound, as with runc.
func (s *service) Kill(ctx context.Context, r *taskAPI.KillRequest) (*ptypes.Empty, error) {
	_, p, err := s.getProc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if p.hasExited() {
		return nil, errdefs.ToGRPCf(errdefs.ErrNotFound, "process %s already finished", execOrContainer(r.ID, r.ExecID))
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if r.ExecID != "" && !started {
		// Added but never started: there is nothing in the guest.
		p.setExited(128+r.Signal, time.Now())
		return empty, nil
	}
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	_, err = c.SignalProcess(ctx, &agent.SignalProcessRequest{ContainerId: r.ID, ExecId: r.ExecID, Signal: r.Signal, All: r.All})
	if err != nil {
		return nil, agentclient.Err(err)
	}
	return empty, nil
}

func (s *service) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	if _, err := s.getTask(r.ID); err != nil {
		return nil, err
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	resp, err := c.ListProcesses(ctx, &agent.ContainerRequest{ContainerId: r.ID})
	if err != nil {
		return nil, agentclient.Err(err)
	}
	out := &taskAPI.PidsResponse{}
	for _, pid := range resp.Pids {
		out.Processes = append(out.Processes, &tasktypes.ProcessInfo{Pid: pid})
	}
	return out, nil
}

func (s *service) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.getProc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	if !r.Stdin {
		return empty, nil
	}
	p.closeStdin()
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	if _, err := c.CloseStdin(ctx, &agent.ProcessRequest{ContainerId: r.ID, ExecId: r.ExecID}); err != nil && !agentclient.IsNotFound(err) {
		return nil, agentclient.Err(err)
	}
	return empty, nil
}

func (s *service) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*ptypes.Empty, error) {
	return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "checkpoint is not supported by hull")
}

// Update applies new resources to the container's cgroup in the guest.
func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error) {
	if _, err := s.getTask(r.ID); err != nil {
		return nil, err
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	// The Any holds OCI LinuxResources as JSON, which the agent takes.
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	if _, err := c.UpdateContainer(ctx, &agent.UpdateContainerRequest{ContainerId: r.ID, Resources: r.Resources.GetValue()}); err != nil {
		return nil, agentclient.Err(err)
	}
	return empty, nil
}

// Wait blocks until the process has exited; CRI notices exits only here.
func (s *service) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	_, p, err := s.getProc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return nil, errdefs.ToGRPC(ctx.Err())
	}
	status, at := p.status()
	return &taskAPI.WaitResponse{ExitStatus: status, ExitedAt: protobuf.ToTimestamp(at)}, nil
}

func (s *service) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	resp := &taskAPI.ConnectResponse{ShimPid: uint32(os.Getpid())}
	if t, err := s.getTask(r.ID); err == nil {
		t.init.mu.Lock()
		resp.TaskPid = t.init.pid
		t.init.mu.Unlock()
	}
	return resp, nil
}

// Shutdown ends the shim once it holds no task.
func (s *service) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*ptypes.Empty, error) {
	s.mu.Lock()
	n := len(s.tasks)
	s.mu.Unlock()
	if n == 0 {
		s.sd.Shutdown()
	}
	return empty, nil
}
