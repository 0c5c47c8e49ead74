package sandbox

import (
	"context"
	"io"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// VM is what a sandbox needs of its hypervisor: vm.Hypervisor, and the
// hotplug of a container's block devices. Boot runs a *qemu.QEMU; tests
// give a fake (internal/sandbox/sandboxtest).
type VM interface {
	vm.Hypervisor
	AddDisk(ctx context.Context, d vm.DiskConfig) (vm.Disk, error)
	RemoveDisk(ctx context.Context, id string) error
	// Disks lists the ids of the hotplugged disks.
	Disks() []string
}

// nmiInjector is a VM that can send its guest an NMI (InjectPanic, for
// the fault-injection tests only).
type nmiInjector interface {
	InjectNMI(ctx context.Context) error
}

var (
	_ VM               = (*qemu.QEMU)(nil)
	_ nmiInjector      = (*qemu.QEMU)(nil)
	_ agentPortWatcher = (*qemu.QEMU)(nil)
)

// Agent is what the host asks of the guest agent: the calls the sandbox
// and the shim make. Its errors are the agent's statuses, which callers
// convert with agentclient.Err. Boot dials an *agentclient.Client; tests
// give a fake (internal/sandbox/sandboxtest).
type Agent interface {
	// A container's life.
	CreateContainer(context.Context, *agent.CreateContainerRequest) (*agent.CreateContainerResponse, error)
	StartContainer(context.Context, *agent.ContainerRequest) (*agent.Empty, error)
	PauseContainer(context.Context, *agent.ContainerRequest) (*agent.Empty, error)
	ResumeContainer(context.Context, *agent.ContainerRequest) (*agent.Empty, error)
	UpdateContainer(context.Context, *agent.UpdateContainerRequest) (*agent.Empty, error)
	StatsContainer(context.Context, *agent.ContainerRequest) (*agent.StatsContainerResponse, error)
	ListProcesses(context.Context, *agent.ContainerRequest) (*agent.ListProcessesResponse, error)
	RemoveContainer(context.Context, *agent.RemoveContainerRequest) (*agent.Empty, error)

	// A process's life (a container's init, or an exec).
	ExecProcess(context.Context, *agent.ExecProcessRequest) (*agent.ExecProcessResponse, error)
	SignalProcess(context.Context, *agent.SignalProcessRequest) (*agent.Empty, error)
	WaitProcess(context.Context, *agent.ProcessRequest) (*agent.WaitProcessResponse, error)
	ResizeTTY(context.Context, *agent.ResizeTTYRequest) (*agent.Empty, error)
	CloseStdin(context.Context, *agent.ProcessRequest) (*agent.Empty, error)

	// Streams: a process's stdio, and a guest port (CRI PortForward).
	CopyOut(ctx context.Context, containerID, execID string, s agentclient.Stream, w io.Writer) error
	CopyIn(ctx context.Context, containerID, execID string, r io.Reader) error
	DialPort(ctx context.Context, port int) (*agentclient.PortConn, error)

	// Shutdown powers the guest off; Close ends the connection.
	Shutdown(context.Context, *agent.Empty) (*agent.Empty, error)
	Close() error
}

var _ Agent = (*agentclient.Client)(nil)
