// Package agent is the guest agent's ttrpc service and its boot sequence.
package agent

import (
	"context"
	"errors"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/container"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/network"
)

// Version is the agent's version string.
var Version = "dev"

// Service implements the AgentService.
type Service struct {
	Containers *container.Manager
	// ReadyNs is the guest uptime at which the channel was open.
	ReadyNs uint64
	// PowerOff is called (in the background) by Shutdown.
	PowerOff func()

	ports ports   // forwarded connections (portforward.go)
	sys   pingSys // Ping's system calls; zero: the real ones (reseed.go)
}

var _ agentapi.AgentService = (*Service)(nil)

// ToStatus converts an agent error to a ttrpc status error. It is the only
// place errors become codes.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && !isWrapped(err) {
		return err
	}
	var xe *errdefs.ExecError
	switch {
	case errors.As(err, &xe):
		st := status.New(codes.FailedPrecondition, xe.Error())
		if d, derr := st.WithDetails(&agentapi.ExecError{Code: xe.Code, Path: xe.Path, Reason: xe.Reason}); derr == nil {
			st = d
		}
		return st.Err()
	case errors.Is(err, errdefs.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Unknown, err.Error())
}

func isWrapped(err error) bool {
	_, ok := err.(interface{ GRPCStatus() *status.Status })
	return !ok
}

// ExecErrorFromStatus returns the ExecError detail of an error a client got,
// if it has one.
func ExecErrorFromStatus(err error) (*agentapi.ExecError, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return nil, false
	}
	for _, d := range st.Details() {
		if xe, ok := d.(*agentapi.ExecError); ok {
			return xe, true
		}
	}
	return nil, false
}

func bootTimeNs() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return uint64(ts.Nano())
}

// Ping answers the host's readiness probe. It first takes the host's
// entropy and clock (reseed.go), so that by the time the host hears back
// a guest restored from a template no longer shares them with its
// siblings; the boot id is read after.
func (s *Service) Ping(ctx context.Context, r *agentapi.PingRequest) (*agentapi.PingResponse, error) {
	sys := s.sys.withDefaults()
	if err := takeHostState(sys, r); err != nil {
		return nil, err
	}
	boot, _ := sys.readBootID()
	var uts unix.Utsname
	unix.Uname(&uts)
	return &agentapi.PingResponse{
		AgentVersion:  Version,
		BootId:        strings.TrimSpace(string(boot)),
		KernelRelease: unix.ByteSliceToString(uts.Release[:]),
		UptimeNs:      bootTimeNs(),
		ReadyNs:       s.ReadyNs,
		TimeUnixNs:    sys.now(),
		SandboxPause:  s.Containers != nil && s.Containers.RunsPause(),
	}, nil
}

func (s *Service) CreateContainer(ctx context.Context, r *agentapi.CreateContainerRequest) (*agentapi.CreateContainerResponse, error) {
	var st []container.Storage
	for _, x := range r.Storages {
		st = append(st, container.Storage{Source: x.Source, FSType: x.Fstype, Options: x.Options, MountPoint: x.MountPoint})
	}
	var devs []container.Device
	for _, d := range r.Devices {
		devs = append(devs, container.Device{Path: d.ContainerPath, Type: d.Type, Serial: d.Serial,
			Major: d.Major, Minor: d.Minor, Mode: d.FileMode, UID: d.Uid, GID: d.Gid})
	}
	pid, err := s.Containers.Create(ctx, r.ContainerId, r.OciSpec, st, r.Stdin, devs...)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.CreateContainerResponse{Pid: uint32(pid)}, nil
}

func (s *Service) StartContainer(ctx context.Context, r *agentapi.ContainerRequest) (*agentapi.Empty, error) {
	return &agentapi.Empty{}, ToStatus(s.Containers.Start(ctx, r.ContainerId))
}

func (s *Service) ExecProcess(ctx context.Context, r *agentapi.ExecProcessRequest) (*agentapi.ExecProcessResponse, error) {
	pid, err := s.Containers.Exec(ctx, r.ContainerId, r.ExecId, r.Process, r.Stdin)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.ExecProcessResponse{Pid: uint32(pid)}, nil
}

func (s *Service) SignalProcess(ctx context.Context, r *agentapi.SignalProcessRequest) (*agentapi.Empty, error) {
	if r.Signal == 0 || r.Signal > 64 {
		return nil, status.Errorf(codes.InvalidArgument, "signal %d is out of range", r.Signal)
	}
	return &agentapi.Empty{}, ToStatus(s.Containers.Signal(r.ContainerId, r.ExecId, unix.Signal(r.Signal), r.All))
}

func (s *Service) WaitProcess(ctx context.Context, r *agentapi.ProcessRequest) (*agentapi.WaitProcessResponse, error) {
	p, err := s.Containers.Process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, ToStatus(err)
	}
	e, err := p.Wait(ctx)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.WaitProcessResponse{ExitStatus: e.Status, Signal: e.Signal, ExitedAtNs: e.At.UnixNano(), OomKilled: s.oomKilled(r)}, nil
}

func (s *Service) RemoveContainer(ctx context.Context, r *agentapi.RemoveContainerRequest) (*agentapi.Empty, error) {
	return &agentapi.Empty{}, ToStatus(s.Containers.Remove(ctx, r.ContainerId, r.Force))
}

func (s *Service) WriteStdin(ctx context.Context, r *agentapi.WriteStdinRequest) (*agentapi.WriteStdinResponse, error) {
	p, err := s.Containers.Process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, ToStatus(err)
	}
	n, err := p.WriteStdin(r.Data)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.WriteStdinResponse{Len: uint32(n)}, nil
}

func (s *Service) CloseStdin(ctx context.Context, r *agentapi.ProcessRequest) (*agentapi.Empty, error) {
	p, err := s.Containers.Process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.Empty{}, ToStatus(p.CloseStdin())
}

func (s *Service) read(ctx context.Context, r *agentapi.ReadStreamRequest, stderr bool) (*agentapi.ReadStreamResponse, error) {
	p, err := s.Containers.Process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, ToStatus(err)
	}
	st := p.Stdout
	if stderr {
		st = p.Stderr
	}
	data, eof, err := st.Read(ctx, int(r.Max))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.ReadStreamResponse{Data: data, Eof: eof}, nil
}

func (s *Service) ReadStdout(ctx context.Context, r *agentapi.ReadStreamRequest) (*agentapi.ReadStreamResponse, error) {
	return s.read(ctx, r, false)
}

func (s *Service) ReadStderr(ctx context.Context, r *agentapi.ReadStreamRequest) (*agentapi.ReadStreamResponse, error) {
	return s.read(ctx, r, true)
}

func (s *Service) ResizeTTY(ctx context.Context, r *agentapi.ResizeTTYRequest) (*agentapi.Empty, error) {
	p, err := s.Containers.Process(r.ContainerId, r.ExecId)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.Empty{}, ToStatus(p.Resize(r.Width, r.Height))
}

func (s *Service) ListProcesses(ctx context.Context, r *agentapi.ContainerRequest) (*agentapi.ListProcessesResponse, error) {
	pids, err := s.Containers.Pids(r.ContainerId)
	if err != nil {
		return nil, ToStatus(err)
	}
	resp := &agentapi.ListProcessesResponse{}
	for _, p := range pids {
		resp.Pids = append(resp.Pids, uint32(p))
	}
	return resp, nil
}

func (s *Service) StatsContainer(ctx context.Context, r *agentapi.ContainerRequest) (*agentapi.StatsContainerResponse, error) {
	st, err := s.Containers.Stats(r.ContainerId)
	if err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.StatsContainerResponse{
		CpuUsageNs: st.CPUUsageNs, CpuUserNs: st.CPUUserNs, CpuSystemNs: st.CPUSystemNs,
		MemoryUsageBytes: st.MemoryUsage, MemoryLimitBytes: st.MemoryLimit, MemoryWorkingSetBytes: st.MemoryWorkingSet,
		PidsCurrent: st.PidsCurrent, PidsLimit: st.PidsLimit, OomKills: st.OOMKills,
	}, nil
}

func (s *Service) UpdateContainer(ctx context.Context, r *agentapi.UpdateContainerRequest) (*agentapi.Empty, error) {
	return &agentapi.Empty{}, ToStatus(s.Containers.Update(r.ContainerId, r.Resources))
}

func (s *Service) PauseContainer(ctx context.Context, r *agentapi.ContainerRequest) (*agentapi.Empty, error) {
	return &agentapi.Empty{}, ToStatus(s.Containers.Freeze(ctx, r.ContainerId, true))
}

func (s *Service) ResumeContainer(ctx context.Context, r *agentapi.ContainerRequest) (*agentapi.Empty, error) {
	return &agentapi.Empty{}, ToStatus(s.Containers.Freeze(ctx, r.ContainerId, false))
}

// Shutdown replies, then powers off about 100 ms later.
func (s *Service) Shutdown(ctx context.Context, _ *agentapi.Empty) (*agentapi.Empty, error) {
	if s.PowerOff != nil {
		go func() {
			time.Sleep(100 * time.Millisecond)
			s.PowerOff()
		}()
	}
	return &agentapi.Empty{}, nil
}

// SetupNetwork configures the guest's NICs, addresses, routes and
// neighbours as the pod's network namespace has them.
func (s *Service) SetupNetwork(ctx context.Context, req *agentapi.SetupNetworkRequest) (*agentapi.Empty, error) {
	if err := network.Apply(nil, req); err != nil {
		return nil, ToStatus(err)
	}
	return &agentapi.Empty{}, nil
}
