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
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/releasers"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
	"github.com/hull-runtime/hull/internal/vm"
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

	vm     VM
	client Agent
	bootID string
	// hullPause: the agent runs Hull's pause for a CRI sandbox container
	// and uses nothing of its rootfs (PingResponse.sandbox_pause).
	hullPause bool
	// restored: the VM was restored from a template (key template),
	// not booted.
	restored bool
	template string
	dead     chan struct{} // closed when QEMU has exited

	powerOffOnce sync.Once
}

// New is the sandbox of a VM that runs and an agent that answers on it
// (ping: its answer to Ping), with o's ID, Config, Hostname, Log and State
// (its directory): what Boot returns, from parts the caller made (tests:
// fakes, sandboxtest). Dead closes when v's Done does.
func New(o Options, v VM, a Agent, ping *agent.PingResponse) *Sandbox {
	s := newSandbox(o)
	s.vm, s.client = v, a
	s.tookPing(ping)
	s.watchVM()
	return s
}

// newSandbox is the sandbox of o, with no VM yet.
func newSandbox(o Options) *Sandbox {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	s := &Sandbox{
		ID:       o.ID,
		Hostname: o.Hostname,
		log:      o.Log.With("sandbox", o.ID),
		cfg:      o.Config,
		dead:     make(chan struct{}),
	}
	if o.State != nil {
		s.Dir = o.State.Dir()
	}
	return s
}

// tookPing keeps what the agent's first answer says of the guest.
func (s *Sandbox) tookPing(ping *agent.PingResponse) {
	s.bootID, s.hullPause = ping.GetBootId(), ping.GetSandboxPause()
}

// watchVM closes s.dead once the VM has exited.
func (s *Sandbox) watchVM() {
	go func() {
		<-s.vm.Done()
		close(s.dead)
	}()
}

// Release releases what h records, for one container or (container "")
// the whole sandbox: the one release path. Idempotent.
func Release(ctx context.Context, h *state.Handle, container string) error {
	if container == "" {
		// The pod cgroup can go only once this process has left it.
		if err := leavePod(); err != nil {
			return err
		}
	}
	return state.Release(ctx, h, container, releasers.All())
}

// SharedDir is the host directory exported to the guest as SharedTag: a
// view of TreeDir whose structure is read-only (storage.MakeShare).
func (s *Sandbox) SharedDir() string { return filepath.Join(s.Dir, storage.ShareName) }

// TreeDir is the host's private tree the shim builds containers'
// directories and binds in; the guest sees it only through SharedDir.
func (s *Sandbox) TreeDir() string { return filepath.Join(s.Dir, storage.TreeName) }

// Agent is the guest agent's connection; valid after Boot.
func (s *Sandbox) Agent() Agent { return s.client }

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
	n, ok := s.vm.(nmiInjector)
	if !ok {
		return errors.New("injecting an NMI: the VM cannot")
	}
	return n.InjectNMI(ctx)
}

// CreateTimeout is runtime.create_container_timeout (60 s when unset).
func (s *Sandbox) CreateTimeout() time.Duration {
	if d := s.cfg.Runtime.CreateContainerTimeoutDuration(); d > 0 {
		return d
	}
	return 60 * time.Second
}
