// Package sandbox owns one pod's VM: the shared directory exported to the
// guest, QEMU, and the agent connection. The shim creates one Sandbox per
// pod, from the process that serves the task API, so that QEMU dies with
// that process.
//
// Every host resource is recorded in the sandbox's state
// (internal/state) before it is acquired, and released only by
// state.Release: a failed Boot, Stop and the shim's `delete` all end
// there.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/network"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// DefaultRunDir is the parent of every sandbox's runtime directory: the
// state store's root.
const DefaultRunDir = config.DefaultRunDir

// Timeouts of the teardown steps.
const (
	shutdownTimeout = 3 * time.Second // the agent's Shutdown RPC
	stopGrace       = 5 * time.Second // guest power-off before SIGKILL
	releaseTimeout  = 30 * time.Second
)

// Options describe one sandbox.
type Options struct {
	ID        string
	Config    *config.Config
	VCPUs     int
	MemoryMiB int
	// Hostname is the pod's hostname (the sandbox spec's).
	Hostname string
	// Netns is the pod's network namespace path (the sandbox spec's
	// network namespace, made by CNI); "" for none: the VM gets no NIC.
	Netns string
	// CgroupsPath is the sandbox spec's linux.cgroupsPath: with
	// runtime.sandbox_cgroup_only, QEMU runs in this cgroup (cgroup.go).
	// "" for none: QEMU stays in the caller's cgroup.
	CgroupsPath string
	Log         *slog.Logger
	// State is the sandbox's state, created (Store.Create) by the process
	// that will own QEMU and held by the caller during Boot. Boot records
	// every resource in it before acquiring it, and on failure releases
	// the whole sandbox through it.
	State *state.Handle
	// Failpoints armed for this sandbox (fault-injection tests only).
	Failpoints failpoint.Set
}

// Sandbox is one pod's VM.
type Sandbox struct {
	ID       string
	Dir      string
	Hostname string
	log      *slog.Logger
	cfg      *config.Config

	vm     *qemu.QEMU
	client *agentclient.Client
	bootID string
	dead   chan struct{} // closed when QEMU has exited

	powerOffOnce sync.Once
}

// Releasers are the releasers of every kind the shim records: the
// built-in ones and those registered by the packages linked in.
func Releasers() state.Releasers { return state.DefaultReleasers() }

// Release releases what h records, for one container or (container "")
// the whole sandbox: the one release path. Idempotent.
func Release(ctx context.Context, h *state.Handle, container string) error {
	if container == "" {
		// The pod cgroup can go only once this process has left it.
		if err := leavePod(); err != nil {
			return err
		}
	}
	return state.Release(ctx, h, container, Releasers())
}

// SharedDir is the host directory exported to the guest as SharedTag: a
// view of TreeDir whose structure is read-only (storage.MakeShare).
func (s *Sandbox) SharedDir() string { return filepath.Join(s.Dir, storage.ShareName) }

// TreeDir is the host's private tree the shim builds containers'
// directories and binds in; the guest sees it only through SharedDir.
func (s *Sandbox) TreeDir() string { return filepath.Join(s.Dir, storage.TreeName) }

// Agent is the agent client; valid after Boot.
func (s *Sandbox) Agent() *agentclient.Client { return s.client }

// Dead is closed once the VM has exited.
func (s *Sandbox) Dead() <-chan struct{} { return s.dead }

// BootID is the guest's boot id.
func (s *Sandbox) BootID() string { return s.bootID }

// QEMUPid is QEMU's pid (0 before Boot).
func (s *Sandbox) QEMUPid() int {
	if s.vm == nil {
		return 0
	}
	return s.vm.Pid()
}

// Dir is the runtime directory of sandbox id under runDir.
func Dir(runDir, id string) string {
	if runDir == "" {
		runDir = DefaultRunDir
	}
	return filepath.Join(runDir, id)
}

// QEMUResource is the record of the sandbox's QEMU: pid 0 before it is
// started, then its pid and start time.
func QEMUResource(pid int, startTime uint64) state.Resource {
	return state.Resource{Kind: state.KindProcess, Key: state.RoleQEMU, Pid: pid, StartTime: startTime,
		Data: map[string]string{"role": state.RoleQEMU}}
}

// Boot creates the shared directory, starts QEMU and waits for the agent,
// recording each resource in o.State first. ctx bounds the boot only; the
// VM lives until Stop. On error the whole sandbox has been released
// (state included) through the one release path.
func Boot(ctx context.Context, o Options) (_ *Sandbox, retErr error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.State == nil {
		return nil, errors.New("booting sandbox " + o.ID + ": no state handle")
	}
	s := &Sandbox{
		ID:       o.ID,
		Dir:      o.State.Dir(),
		Hostname: o.Hostname,
		log:      o.Log.With("sandbox", o.ID),
		cfg:      o.Config,
		dead:     make(chan struct{}),
	}
	defer func() {
		if retErr == nil {
			return
		}
		if s.client != nil {
			s.client.Close()
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		if err := Release(rctx, o.State, ""); err != nil {
			s.log.Warn("rolling back failed boot", "error", err)
		}
		if s.vm != nil && s.vm.Pid() != 0 {
			<-s.vm.Done() // released (killed); reaped by its exec.Cmd
		}
	}()
	rec := o.State
	shared := s.SharedDir()
	if err := storage.MakeShare(rec, s.Dir); err != nil {
		return nil, err
	}
	if err := o.Failpoints.Check(failpoint.VMDir); err != nil {
		return nil, err
	}
	var cgroups []string
	if o.CgroupsPath != "" && o.Config.Runtime.SandboxCgroupOnly {
		var err error
		if cgroups, err = makeCgroup(rec, o.CgroupsPath); err != nil {
			return nil, err
		}
		// The shim joins first: QEMU then starts in the pod's cgroup.
		if err := joinPod(cgroups); err != nil {
			return nil, fmt.Errorf("placing the shim in the pod cgroup: %w", err)
		}
	}

	// The pod's network: Hull's links and filters in the pod netns,
	// recorded before they are created and released with the sandbox.
	ep, err := network.Setup(network.Options{
		Netns: o.Netns, Model: o.Config.Runtime.InternetworkingModel, Recorder: rec, Log: s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("setting up the pod network: %w", err)
	}
	defer ep.Close() // QEMU holds its own copies once started

	h := o.Config.Hypervisor
	params := h.KernelParams
	if _, ok := o.Failpoints.Armed(failpoint.GuestPanic); ok {
		// An unclaimed NMI panics the guest (InjectPanic).
		params = append(params[:len(params):len(params)], "unknown_nmi_panic")
	}
	if _, ok := o.Failpoints.Armed(failpoint.AgentFatal); ok {
		params = append(params[:len(params):len(params)], "hull_failpoint="+failpoint.AgentFatal)
	}
	if o.Config.Agent.EnableDebug {
		// Undotted, so the kernel hands it to the agent in its environment.
		params = append(params[:len(params):len(params)], "hull_debug=1")
	}
	hv, err := qemu.New(vm.Config{
		ID:           o.ID,
		Dir:          s.Dir,
		Binary:       h.Path,
		MachineType:  h.MachineType,
		Firmware:     h.Firmware,
		VCPUs:        o.VCPUs,
		MemoryMiB:    o.MemoryMiB,
		Kernel:       h.Kernel,
		Initrd:       h.Initrd,
		KernelParams: params,
		Accel:        "auto",
		Shares:       []vm.Share{{Tag: storage.SharedTag, HostPath: shared}},
		NICs:         ep.NICs,
		// The agent logs to the guest console: its lines, and the guest
		// kernel's, land in the shim's log with the sandbox key.
		ConsoleOutput: func(line string) { s.log.Info("guest console", "line", line) },
	}, s.log)
	if err != nil {
		return nil, fmt.Errorf("configuring the VM: %w", err)
	}
	// What QEMU creates in the sandbox directory, then QEMU itself.
	for _, r := range []state.Resource{
		{Kind: state.KindSocket, Key: hv.QMPSocket()},
		{Kind: state.KindSocket, Key: hv.AgentSocket()},
		{Kind: state.KindFile, Key: hv.ConsoleLog()},
		{Kind: state.KindFile, Key: hv.ConsoleLogRotated()},
		{Kind: state.KindFile, Key: hv.LogFile()},
		{Kind: state.KindDir, Key: hv.ChrootDir()},
		hv.ProcFDMountResource(),
		QEMUResource(0, 0),
	} {
		if err := rec.Record(r); err != nil {
			return nil, err
		}
	}
	dialTimeout := o.Config.Agent.DialTimeoutDuration()
	if dialTimeout <= 0 {
		dialTimeout = 30 * time.Second
	}
	bootCtx, cancel := context.WithTimeout(ctx, dialTimeout+10*time.Second)
	defer cancel()
	if err := hv.Start(bootCtx); err != nil {
		return nil, fmt.Errorf("starting the VM: %w", err)
	}
	s.vm = hv
	start, err := state.ProcessStartTime(hv.Pid())
	if err == nil {
		err = rec.Record(QEMUResource(hv.Pid(), start))
	}
	if err != nil {
		// Unrecorded, QEMU could outlive a crash of this process only
		// until the parent-death signal; do not keep it.
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		defer scancel()
		hv.Stop(sctx, 0)
		return nil, fmt.Errorf("recording QEMU (pid %d): %w", hv.Pid(), err)
	}
	// QEMU was forked in the pod's cgroup; make sure of it (a no-op
	// unless something moved it).
	if err := cgroup.Join(cgroups, hv.Pid()); err != nil {
		return nil, fmt.Errorf("placing QEMU in the pod cgroup: %w", err)
	}
	if err := o.Failpoints.Check(failpoint.QEMUStart); err != nil {
		return nil, err
	}
	actx, acancel := context.WithTimeout(bootCtx, dialTimeout)
	defer acancel()
	client, ping, err := agentclient.Dial(actx, hv.AgentSocket(), hv.Done())
	if err != nil {
		return nil, s.withConsole(fmt.Errorf("waiting %v for the guest agent: %w", dialTimeout, err))
	}
	s.client = client
	s.bootID = ping.BootId
	if err := o.Failpoints.Check(failpoint.AgentConnect); err != nil {
		return nil, err
	}
	if len(ep.Request.GetInterfaces()) > 0 {
		if _, err := client.SetupNetwork(actx, ep.Request); err != nil {
			return nil, s.withConsole(fmt.Errorf("configuring the guest network: %w", err))
		}
	}
	go func() {
		<-hv.Done()
		close(s.dead)
	}()
	s.log.Info("sandbox VM ready", "qemu_pid", hv.Pid(), "boot_id", ping.BootId, "kernel", ping.KernelRelease)
	return s, nil
}

// withConsole appends the tail of the guest console to err.
func (s *Sandbox) withConsole(err error) error {
	return vm.WithConsole(err, s.vm.ConsoleTail(20))
}

// PowerOff asks the guest to power off (the agent's Shutdown), stops
// QEMU (SIGKILL after a grace period) and closes the agent connection.
// It acts on this process's VM only; what is on the host is released by
// Release. Idempotent.
func (s *Sandbox) PowerOff() error {
	var err error
	s.powerOffOnce.Do(func() {
		if s.client != nil {
			select {
			case <-s.vm.Done():
			default:
				// The guest powers itself off: QEMU then exits at once.
				sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
				_, _ = s.client.Shutdown(sctx, &agent.Empty{})
				cancel()
			}
		}
		if s.vm != nil {
			sctx, cancel := context.WithTimeout(context.Background(), stopGrace+2*time.Second)
			err = s.vm.Stop(sctx, stopGrace)
			cancel()
		}
		if s.client != nil {
			s.client.Close()
		}
	})
	return err
}

// Stop powers the VM off and releases the whole sandbox recorded in h
// (its open state). Idempotent.
func (s *Sandbox) Stop(ctx context.Context, h *state.Handle) error {
	if err := s.PowerOff(); err != nil {
		// QEMU's record makes Release kill it if it still runs.
		s.log.Warn("stopping the VM", "error", err)
	}
	if err := Release(ctx, h, ""); err != nil {
		return err
	}
	s.log.Info("sandbox released")
	return nil
}

// InjectPanic makes the guest kernel panic, as when the agent (the
// guest's PID 1) dies: an NMI nobody claims, with unknown_nmi_panic on the
// kernel command line (Boot adds it when failpoint.GuestPanic is armed).
// For the fault-injection tests.
func (s *Sandbox) InjectPanic(ctx context.Context) error {
	c := s.vm.QMP()
	if c == nil {
		return errors.New("injecting an NMI: no QMP connection")
	}
	if err := c.Execute(ctx, "inject-nmi", nil, nil); err != nil {
		return fmt.Errorf("injecting an NMI: %w", err)
	}
	return nil
}

// CreateTimeout is runtime.create_container_timeout (60 s when unset).
func (s *Sandbox) CreateTimeout() time.Duration {
	if d := s.cfg.Runtime.CreateContainerTimeoutDuration(); d > 0 {
		return d
	}
	return 60 * time.Second
}
