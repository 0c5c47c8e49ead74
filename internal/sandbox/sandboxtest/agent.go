package sandboxtest

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/sandbox"
)

var _ sandbox.Agent = (*Agent)(nil)

// Agent is a fake guest agent that keeps containers and processes as the
// real one answers about them: a container or process it does not know
// is a NotFound status, a signal ends a process (status 128+signal), and
// once the connection is gone (Die, Close) every call fails with
// ttrpc.ErrClosed, a pending WaitProcess included.
//
// Calls are recorded as "agent.<Method> <container>[/<exec>]", except
// those the shim makes from background goroutines (WaitProcess, CopyOut,
// CopyIn), whose order is not the test's to know.
type Agent struct {
	calls *Calls
	gone  chan struct{} // closed by Die or Close
	once  sync.Once

	// mu guards the fields below.
	mu         sync.Mutex
	containers map[string]bool
	procs      map[string]*process // by processKey
	fail       map[string]error    // by method
	nextPid    uint32
}

type process struct {
	exited chan struct{}
	status uint32
}

// NewAgent is a connected fake agent recording its calls in calls (nil:
// its own).
func NewAgent(calls *Calls) *Agent {
	if calls == nil {
		calls = &Calls{}
	}
	return &Agent{calls: calls, gone: make(chan struct{}), containers: map[string]bool{},
		procs: map[string]*process{}, fail: map[string]error{}, nextPid: 100}
}

func processKey(containerID, execID string) string {
	if execID == "" {
		return containerID
	}
	return containerID + "/" + execID
}

func notFound(what string) error { return status.Errorf(codes.NotFound, "%s not found", what) }

// Fail makes every call of method (e.g. "StartContainer") return err,
// until Fail(method, nil).
func (a *Agent) Fail(method string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		delete(a.fail, method)
		return
	}
	a.fail[method] = err
}

// Die breaks the connection, as when the guest agent dies or the VM goes
// away: every call, pending or later, fails with ttrpc.ErrClosed.
func (a *Agent) Die() { a.once.Do(func() { close(a.gone) }) }

// Exit ends a process in the guest with status, as when its command
// returns. It reports whether the process was running.
func (a *Agent) Exit(containerID, execID string, status uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.exitLocked(processKey(containerID, execID), status)
}

// exitLocked ends process key; a.mu is held.
func (a *Agent) exitLocked(key string, status uint32) bool {
	p, ok := a.procs[key]
	if !ok {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
	}
	p.status = status
	close(p.exited)
	return true
}

// Running reports whether the agent holds container id.
func (a *Agent) Running(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.containers[id]
}

// call records method on process key and returns the error it fails
// with: the connection's, or the one set with Fail.
func (a *Agent) call(method, key string, record bool) error {
	switch {
	case record && key != "":
		a.calls.add("agent.%s %s", method, key)
	case record:
		a.calls.add("agent.%s", method)
	}
	select {
	case <-a.gone:
		return ttrpc.ErrClosed
	default:
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fail[method]
}

// onContainer is call for a method on container id, NotFound when the
// agent does not hold it.
func (a *Agent) onContainer(method, id string) error {
	if err := a.call(method, id, true); err != nil {
		return err
	}
	if !a.Running(id) {
		return notFound("container " + id)
	}
	return nil
}

// startLocked makes process key run and returns its pid; a.mu is held.
func (a *Agent) startLocked(key string) uint32 {
	a.nextPid++
	a.procs[key] = &process{exited: make(chan struct{})}
	return a.nextPid
}

func (a *Agent) CreateContainer(_ context.Context, r *agent.CreateContainerRequest) (*agent.CreateContainerResponse, error) {
	if err := a.call("CreateContainer", r.ContainerId, true); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.containers[r.ContainerId] {
		return nil, status.Errorf(codes.AlreadyExists, "container %s exists", r.ContainerId)
	}
	a.containers[r.ContainerId] = true
	return &agent.CreateContainerResponse{Pid: a.startLocked(r.ContainerId)}, nil
}

func (a *Agent) StartContainer(_ context.Context, r *agent.ContainerRequest) (*agent.Empty, error) {
	return reply(a.onContainer("StartContainer", r.ContainerId))
}

// RemoveContainer kills what still runs in the container (status 137)
// and forgets it.
func (a *Agent) RemoveContainer(_ context.Context, r *agent.RemoveContainerRequest) (*agent.Empty, error) {
	if err := a.onContainer("RemoveContainer", r.ContainerId); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for key := range a.procs {
		if inContainer(key, r.ContainerId) {
			a.exitLocked(key, 137)
			delete(a.procs, key)
		}
	}
	delete(a.containers, r.ContainerId)
	return &agent.Empty{}, nil
}

func (a *Agent) ExecProcess(_ context.Context, r *agent.ExecProcessRequest) (*agent.ExecProcessResponse, error) {
	if err := a.call("ExecProcess", processKey(r.ContainerId, r.ExecId), true); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.containers[r.ContainerId] {
		return nil, notFound("container " + r.ContainerId)
	}
	return &agent.ExecProcessResponse{Pid: a.startLocked(processKey(r.ContainerId, r.ExecId))}, nil
}

// SignalProcess ends the process (or with All, every process of the
// container) with status 128+signal.
func (a *Agent) SignalProcess(_ context.Context, r *agent.SignalProcessRequest) (*agent.Empty, error) {
	key := processKey(r.ContainerId, r.ExecId)
	if err := a.call("SignalProcess", key, true); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.exitLocked(key, 128+r.Signal) {
		return nil, notFound("process " + key)
	}
	if r.All {
		for k := range a.procs {
			if inContainer(k, r.ContainerId) {
				a.exitLocked(k, 128+r.Signal)
			}
		}
	}
	return &agent.Empty{}, nil
}

// WaitProcess waits for the process's exit, the connection's end or ctx.
func (a *Agent) WaitProcess(ctx context.Context, r *agent.ProcessRequest) (*agent.WaitProcessResponse, error) {
	key := processKey(r.ContainerId, r.ExecId)
	if err := a.call("WaitProcess", key, false); err != nil {
		return nil, err
	}
	a.mu.Lock()
	p, ok := a.procs[key]
	a.mu.Unlock()
	if !ok {
		return nil, notFound("process " + key)
	}
	select {
	case <-p.exited:
		a.mu.Lock()
		defer a.mu.Unlock()
		return &agent.WaitProcessResponse{ExitStatus: int32(p.status)}, nil
	case <-a.gone:
		return nil, ttrpc.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (a *Agent) ResizeTTY(_ context.Context, r *agent.ResizeTTYRequest) (*agent.Empty, error) {
	return reply(a.onContainer("ResizeTTY", r.ContainerId))
}

func (a *Agent) CloseStdin(_ context.Context, r *agent.ProcessRequest) (*agent.Empty, error) {
	return reply(a.onContainer("CloseStdin", r.ContainerId))
}

func (a *Agent) PauseContainer(_ context.Context, r *agent.ContainerRequest) (*agent.Empty, error) {
	return reply(a.onContainer("PauseContainer", r.ContainerId))
}

func (a *Agent) ResumeContainer(_ context.Context, r *agent.ContainerRequest) (*agent.Empty, error) {
	return reply(a.onContainer("ResumeContainer", r.ContainerId))
}

func (a *Agent) UpdateContainer(_ context.Context, r *agent.UpdateContainerRequest) (*agent.Empty, error) {
	return reply(a.onContainer("UpdateContainer", r.ContainerId))
}

func (a *Agent) StatsContainer(_ context.Context, r *agent.ContainerRequest) (*agent.StatsContainerResponse, error) {
	return &agent.StatsContainerResponse{}, a.onContainer("StatsContainer", r.ContainerId)
}

func (a *Agent) ListProcesses(_ context.Context, r *agent.ContainerRequest) (*agent.ListProcessesResponse, error) {
	return &agent.ListProcessesResponse{}, a.onContainer("ListProcesses", r.ContainerId)
}

// CopyOut ends at once: the fake's processes write nothing.
func (a *Agent) CopyOut(_ context.Context, containerID, execID string, _ agentclient.Stream, _ io.Writer) error {
	return a.call("ReadStdout", processKey(containerID, execID), false)
}

// CopyIn discards r.
func (a *Agent) CopyIn(_ context.Context, containerID, execID string, r io.Reader) error {
	if err := a.call("WriteStdin", processKey(containerID, execID), false); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, r)
	return err
}

// DialPort fails: the fake has no guest ports.
func (a *Agent) DialPort(context.Context, int) (*agentclient.PortConn, error) {
	if err := a.call("OpenPort", "", true); err != nil {
		return nil, err
	}
	return nil, errors.New("the fake agent has no guest ports")
}

func (a *Agent) Shutdown(context.Context, *agent.Empty) (*agent.Empty, error) {
	return reply(a.call("Shutdown", "", true))
}

// Close ends the connection, as Die does.
func (a *Agent) Close() error {
	a.calls.add("agent.Close")
	a.Die()
	return nil
}

// inContainer reports whether process key is container id's.
func inContainer(key, id string) bool { return key == id || strings.HasPrefix(key, id+"/") }

// reply is a call's answer: nothing on error, as a real client returns.
func reply(err error) (*agent.Empty, error) {
	if err != nil {
		return nil, err
	}
	return &agent.Empty{}, nil
}
