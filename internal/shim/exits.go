// Exits: how a task's exit is noticed (the agent's Wait, or the VM dying)
// and reported in order, and how a task's and the sandbox's resources
// are released through the one release path.

package shim

import (
	"context"
	"errors"
	"io/fs"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/sandbox"
)

// watch waits for a process's exit and reports it. The agent's
// WaitProcess fails when the VM goes away: the process is then lost.
func (s *service) watch(t *task, p *proc) {
	c, err := s.agent()
	status, at := exitVMLost, time.Now()
	if err == nil {
		resp, werr := c.WaitProcess(context.Background(), &agent.ProcessRequest{ContainerId: p.containerID, ExecId: p.execID})
		if werr == nil {
			status = uint32(resp.ExitStatus)
			s.reportOOM(t, p, resp)
			if resp.ExitedAtNs > 0 {
				at = time.Unix(0, resp.ExitedAtNs)
			}
		} else {
			s.logger(t.id).WithError(werr).WithField("exec", p.execID).Warn("lost the process: the VM or its agent is gone")
		}
	}
	p.drain()
	s.reportExit(t, p, status, at)
}

// reportExit records an exit and publishes TaskExit, after the process's
// TaskStart (startMu) and never twice.
func (s *service) reportExit(t *task, p *proc, status uint32, at time.Time) {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	if !p.setExited(status, at) {
		return
	}
	p.mu.Lock()
	startFailed, pid := p.startFailed, p.pid
	p.mu.Unlock()
	s.logger(t.id).WithField("exec", p.execID).WithField("status", status).Info("process exited")
	if startFailed {
		// Start returned the error; CRI reports it from there.
		return
	}
	s.events.send(&eventstypes.TaskExit{
		ContainerID: t.id,
		ID:          execOrContainer(t.id, p.execID),
		Pid:         pid,
		ExitStatus:  status,
		ExitedAt:    protobuf.ToTimestamp(at),
	})
}

func execOrContainer(id, execID string) string {
	if execID == "" {
		return id
	}
	return execID
}

// watchVM makes a dead VM a dead pod: every process reports an exit and
// the VM's host resources are released at once.
func (s *service) watchVM(sb *sandbox.Sandbox) {
	<-sb.Dead()
	s.mu.Lock()
	var tasks []*task
	for _, t := range s.tasks {
		tasks = append(tasks, t)
	}
	s.mu.Unlock()
	now := time.Now()
	for _, t := range tasks {
		for _, p := range t.procs() {
			p.closeIO()
			s.reportExit(t, p, exitVMLost, now)
		}
	}
	if err := s.stopSandbox(sb); err != nil {
		log.G(s.ctx).WithField("sandbox", sb.ID).WithError(err).Error("releasing the sandbox after its VM exited")
	}
}

// stopSandbox powers the VM off and releases the whole sandbox through
// its state. A sandbox already released (by Delete, or by `shim delete`
// from another process) is not an error.
func (s *service) stopSandbox(sb *sandbox.Sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	h, err := s.store.OpenContext(ctx, sb.ID)
	if errors.Is(err, fs.ErrNotExist) {
		return sb.PowerOff()
	}
	if err != nil {
		sb.PowerOff()
		return err
	}
	defer h.Close()
	return sb.Stop(ctx, h)
}

// vmDeathGrace bounds how long a closed agent connection may precede the
// reaped QEMU exit that explains it.
const vmDeathGrace = 5 * time.Second

// vmDying reports whether err, from the agent, is the VM going away: the
// agent connection closes before QEMU's exit is reaped. A container in a
// dead VM has nothing left to remove, so Delete goes on with the release.
func (s *service) vmDying(sb *sandbox.Sandbox, err error) bool {
	if !errors.Is(err, ttrpc.ErrClosed) {
		return false
	}
	select {
	case <-sb.Dead():
		return true
	case <-time.After(vmDeathGrace):
		return false
	}
}

// releaseTask removes the container from the guest and releases its host
// resources through the sandbox's state; for the sandbox task it also
// stops the VM and releases the whole sandbox. Delete then forgets it.
func (s *service) releaseTask(ctx context.Context, t *task) error {
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	var errs []error
	for _, p := range t.procs() {
		p.closeIO()
	}
	if sb != nil {
		select {
		case <-sb.Dead():
		default:
			if err := removeGuestContainer(sb, t.id); err != nil && !s.vmDying(sb, err) {
				errs = append(errs, err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	h, err := s.store.OpenContext(ctx, t.sandboxID)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Released already: the VM died, or `shim delete` ran.
		if t.isSandbox && sb != nil {
			errs = append(errs, sb.PowerOff())
		}
	case err != nil:
		errs = append(errs, err)
	default:
		errs = append(errs, sandbox.Release(ctx, h, t.id))
		if t.isSandbox && sb != nil {
			errs = append(errs, sb.Stop(ctx, h))
		}
		h.Close()
	}
	return joinErrs(errs)
}

// forgetTask drops a released task (markReleased armed the idle exit).
func (s *service) forgetTask(t *task) {
	s.mu.Lock()
	delete(s.tasks, t.id)
	s.mu.Unlock()
}

// armGuestPanic makes the guest kernel panic after the delay of the
// guest-panic failpoint, when it is armed (fault-injection tests).
func (s *service) armGuestPanic(t *task) {
	delay, ok := t.sandboxFailpoints.Armed(failpoint.GuestPanic)
	if !ok {
		return
	}
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb == nil {
		return
	}
	time.AfterFunc(delay, func() {
		ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
		defer cancel()
		s.logger(t.id).Warn("failpoint guest-panic: making the guest kernel panic")
		if err := sb.InjectPanic(ctx); err != nil {
			s.logger(t.id).WithError(err).Error("failpoint guest-panic")
		}
	})
}
