package sandbox

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/network"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// Boot creates the shared directory, starts QEMU and waits for the agent,
// recording each resource in o.State first. ctx bounds the boot only; the
// VM lives until Stop. On error the whole sandbox has been released
// (state included) through the one release path.
func Boot(ctx context.Context, o Options) (_ *Sandbox, retErr error) {
	if o.State == nil {
		return nil, errors.New("booting sandbox " + o.ID + ": no state handle")
	}
	s := newSandbox(o)
	defer func() {
		if retErr != nil {
			s.rollBack(ctx, o.State)
		}
	}()
	rec := o.State
	if err := storage.MakeShare(rec, s.Dir); err != nil {
		return nil, err
	}
	if err := o.Failpoints.Check(failpoint.VMDir); err != nil {
		return nil, err
	}
	cgroups, err := s.joinPodCgroup(rec, o)
	if err != nil {
		return nil, err
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

	dialTimeout := o.Config.Agent.DialTimeoutDuration()
	if dialTimeout <= 0 {
		dialTimeout = 30 * time.Second
	}
	bootCtx, cancel := context.WithTimeout(ctx, dialTimeout+10*time.Second)
	defer cancel()
	if err := s.startVM(bootCtx, rec, o, ep.NICs, cgroups); err != nil {
		return nil, err
	}
	err = s.connectAgent(bootCtx, s.agentTimeout(dialTimeout), o.Failpoints, ep)
	if errors.Is(err, errAgentSilent) && s.restored {
		// A clone whose agent does not answer (a template whose memory
		// is damaged): boot the VM instead, and let the next pod rebuild
		// the template.
		s.log.Warn("the VM restored from its template did not answer; booting it", "template", s.template, "error", err)
		s.discardClone(ctx, rec)
		if err = s.startQEMU(bootCtx, rec, o, s.vmConfig(o, ep.NICs), cgroups); err == nil {
			err = s.connectAgent(bootCtx, dialTimeout, o.Failpoints, ep)
		}
	}
	if err != nil {
		return nil, err
	}
	s.watchVM()
	return s, nil
}

// cloneAgentTimeout bounds the wait for a restored VM's agent, which
// answers within a second even on a loaded host: its guest is already
// up. Past it the VM is booted instead.
const cloneAgentTimeout = 20 * time.Second

// agentTimeout is how long to wait for the agent of the VM just started.
func (s *Sandbox) agentTimeout(dialTimeout time.Duration) time.Duration {
	if s.restored {
		return min(dialTimeout, cloneAgentTimeout)
	}
	return dialTimeout
}

// agentPortWatcher is a VM that reports its guest opening and closing the agent port
// (QEMU's VSERPORT_CHANGE).
type agentPortWatcher interface {
	WatchAgentPort(open bool) (seen <-chan struct{}, stop func())
}

// dialAgent connects to the VM's agent; when the VM reports its guest
// closing the agent port before the agent answered, it connects again
// (agentclient.DialWatching).
func (s *Sandbox) dialAgent(ctx context.Context) (*agentclient.Client, *agent.PingResponse, error) {
	w, ok := s.vm.(agentPortWatcher)
	if !ok {
		return agentclient.Dial(ctx, s.vm.AgentSocket(), s.vm.Done())
	}
	return agentclient.DialWatching(ctx, s.vm.AgentSocket(), s.vm.Done(), w.WatchAgentPort, func(attempt int, err error) {
		s.log.Warn("connecting to the guest agent again", "reason", err, "connection", attempt, "restored", s.restored)
	})
}

// errAgentSilent marks an agent that did not answer: in time, before its
// VM exited, or on any connection (its guest closed its port on each).
var errAgentSilent = errors.New("the guest agent did not answer")

// rollBack releases what a failed Boot recorded, and waits for a QEMU it
// started to be reaped.
func (s *Sandbox) rollBack(ctx context.Context, h *state.Handle) {
	if s.client != nil {
		s.client.Close()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	if err := Release(rctx, h, ""); err != nil {
		s.log.Warn("rolling back failed boot", "error", err)
	}
	if s.vm != nil && s.vm.Pid() != 0 {
		<-s.vm.Done() // released (killed); reaped by its exec.Cmd
	}
}

// joinPodCgroup creates the pod's cgroup (runtime.sandbox_cgroup_only
// and a spec cgroupsPath), recorded first, and moves this process into
// it, so that QEMU starts there. It returns the cgroup's directories,
// none without one.
func (s *Sandbox) joinPodCgroup(rec *state.Handle, o Options) ([]string, error) {
	if o.CgroupsPath == "" || !o.Config.Runtime.SandboxCgroupOnly {
		return nil, nil
	}
	cgroups, err := makeCgroup(rec, o.CgroupsPath)
	if err != nil {
		return nil, err
	}
	if err := joinPod(cgroups); err != nil {
		return nil, fmt.Errorf("placing the shim in the pod cgroup: %w", err)
	}
	return cgroups, nil
}

// kernelParams are the configured guest kernel parameters, with what the
// armed failpoints and the agent's debug switch add.
func kernelParams(o Options) []string {
	params := o.Config.Hypervisor.KernelParams
	add := func(p string) { params = append(params[:len(params):len(params)], p) }
	if _, ok := o.Failpoints.Armed(failpoint.GuestPanic); ok {
		add("unknown_nmi_panic") // an unclaimed NMI panics the guest (InjectPanic)
	}
	if _, ok := o.Failpoints.Armed(failpoint.AgentFatal); ok {
		add("hull_failpoint=" + failpoint.AgentFatal)
	}
	if o.Config.Agent.EnableDebug {
		add("hull_debug=1") // undotted: the kernel hands it to the agent's environment
	}
	return params
}

// startVM starts the pod's VM: restored from a template when templates
// are on and one can be had, else booted; a clone that fails to start
// falls back to a cold boot with a warning (docs/templates.md).
func (s *Sandbox) startVM(ctx context.Context, rec *state.Handle, o Options, nics []vm.NIC, cgroups []string) error {
	cfg := s.vmConfig(o, nics)
	if clone := s.templateClone(ctx, rec, o, cfg); clone != nil {
		err := s.startQEMU(ctx, rec, o, s.restoreConfig(cfg, clone), cgroups)
		clone.State.Close()
		if err == nil || !errors.Is(err, errQEMUStart) {
			s.restored, s.template = err == nil, clone.Key
			return err
		}
		s.dropTemplate(ctx, rec, clone.Key)
		s.log.Warn("restoring the VM from its template failed; booting it", "template", clone.Key, "error", err)
	}
	return s.startQEMU(ctx, rec, o, cfg, cgroups)
}

// errQEMUStart marks a start that failed in QEMU itself (which is then
// reaped): a clone's may be retried as a cold boot.
var errQEMUStart = errors.New("starting the VM")

// vmConfig is the pod VM's configuration for a cold boot.
func (s *Sandbox) vmConfig(o Options, nics []vm.NIC) vm.Config {
	h := o.Config.Hypervisor
	return vm.Config{
		ID:           o.ID,
		Dir:          s.Dir,
		Binary:       h.Path,
		MachineType:  h.MachineType,
		Firmware:     h.Firmware,
		VCPUs:        o.VCPUs,
		MemoryMiB:    o.MemoryMiB,
		Kernel:       h.Kernel,
		Initrd:       h.Initrd,
		KernelParams: kernelParams(o),
		Accel:        "auto",
		TCGCacheMiB:  h.TCGCacheSize,
		Shares:       []vm.Share{{Tag: storage.SharedTag, HostPath: s.SharedDir()}},
		NICs:         nics,
		// The agent logs to the guest console: its lines, and the guest
		// kernel's, land in the shim's log with the sandbox key.
		ConsoleOutput: func(line string) { s.log.Info("guest console", "line", line) },
	}
}

// startQEMU configures QEMU, records what it will create and QEMU itself,
// starts it, and records its pid and start time.
func (s *Sandbox) startQEMU(ctx context.Context, rec *state.Handle, o Options, cfg vm.Config, cgroups []string) error {
	hv, err := qemu.New(cfg, s.log)
	if err != nil {
		return fmt.Errorf("configuring the VM: %w", err)
	}
	// What QEMU creates in the sandbox directory, then QEMU itself.
	err = rec.RecordAll(
		state.Resource{Kind: state.KindSocket, Key: hv.QMPSocket()},
		state.Resource{Kind: state.KindSocket, Key: hv.AgentSocket()},
		state.Resource{Kind: state.KindFile, Key: hv.ConsoleLog()},
		state.Resource{Kind: state.KindFile, Key: hv.ConsoleLogRotated()},
		state.Resource{Kind: state.KindFile, Key: hv.LogFile()},
		state.Resource{Kind: state.KindDir, Key: hv.RootDir()},
		QEMUResource(0, 0),
	)
	if err != nil {
		return err
	}
	if err := hv.Start(ctx); err != nil {
		return fmt.Errorf("%w: %w", errQEMUStart, err)
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
		return fmt.Errorf("recording QEMU (pid %d): %w", hv.Pid(), err)
	}
	if err := placeQEMU(ctx, hv, cgroups, cgroup.Join); err != nil {
		return err
	}
	return o.Failpoints.Check(failpoint.QEMUStart)
}

// startedVM is what placeQEMU needs of a VM just started.
type startedVM interface {
	Pid() int
	Done() <-chan struct{}
	ExitError() error
	ConsoleTail(n int) []string
}

// placeQEMU makes sure QEMU is in the pod's cgroups: it was forked there,
// so join is a no-op unless something moved it. A QEMU that exited at once
// (a restored guest that died) is a failed start, which a clone retries as
// a boot. Its exit can fail the write (no such process) before it has been
// reaped and Done is closed: then the reaping is waited for.
func placeQEMU(ctx context.Context, hv startedVM, cgroups []string, join func([]string, int) error) error {
	err := join(cgroups, hv.Pid())
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ESRCH) {
		select {
		case <-hv.Done():
		case <-ctx.Done():
		}
	}
	select {
	case <-hv.Done():
		why := hv.ExitError()
		if why == nil {
			why = errors.New("exit status 0")
		}
		return fmt.Errorf("%w: qemu exited at once: %w", errQEMUStart, vm.WithConsole(why, hv.ConsoleTail(10)))
	default:
		return fmt.Errorf("placing QEMU in the pod cgroup: %w", err)
	}
}

// connectAgent waits for the guest agent (bounded by dialTimeout, and
// given up when QEMU exits) and gives the guest the pod's network.
func (s *Sandbox) connectAgent(ctx context.Context, dialTimeout time.Duration, fps failpoint.Set, ep *network.Endpoint) error {
	actx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	client, ping, err := s.dialAgent(actx)
	if err != nil {
		if actx.Err() != nil || errors.Is(err, agentclient.ErrVMExited) || errors.Is(err, agentclient.ErrPortClosed) {
			err = fmt.Errorf("%w: %w", errAgentSilent, err)
		}
		return s.withConsole(fmt.Errorf("waiting %v for the guest agent: %w", dialTimeout, err))
	}
	s.client = client
	s.tookPing(ping)
	if err := fps.Check(failpoint.AgentConnect); err != nil {
		return err
	}
	if len(ep.Request.GetInterfaces()) > 0 {
		if s.restored {
			renameClonedNICs(ep)
		}
		if _, err := client.SetupNetwork(actx, ep.Request); err != nil {
			return s.withConsole(fmt.Errorf("configuring the guest network: %w", err))
		}
	}
	s.log.Info("sandbox VM ready", "qemu_pid", s.vm.Pid(), "boot_id", ping.BootId, "kernel", ping.KernelRelease, "hull_pause", ping.SandboxPause)
	return nil
}
