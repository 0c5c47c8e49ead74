// Package sandbox owns one pod's VM: its runtime directory, the shared
// directory exported to the guest, QEMU, and the agent connection. The
// shim creates one Sandbox per pod, from the process that serves the
// task API, so that QEMU dies with that process.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/rollback"
	"github.com/hull-runtime/hull/internal/storage"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// DefaultRunDir is the parent of every sandbox's runtime directory.
const DefaultRunDir = "/run/hull"

// Timeouts of the teardown steps.
const (
	shutdownTimeout = 3 * time.Second // the agent's Shutdown RPC
	stopGrace       = 5 * time.Second // guest power-off before SIGKILL
)

// Options describe one sandbox.
type Options struct {
	ID string
	// RunDir is the parent of the sandbox directory; "" is DefaultRunDir.
	RunDir    string
	Config    *config.Config
	VCPUs     int
	MemoryMiB int
	// Hostname is the pod's hostname (the sandbox spec's).
	Hostname string
	Log      *slog.Logger
	// Tracker records every resource before it is acquired.
	Tracker Tracker
}

// Sandbox is one pod's VM.
type Sandbox struct {
	ID       string
	Dir      string
	Hostname string
	log      *slog.Logger
	tracker  Tracker
	cfg      *config.Config

	vm     *qemu.QEMU
	client *agentclient.Client
	bootID string
	dead   chan struct{} // closed when QEMU exits or the agent is lost
	// cleanup releases everything in reverse order of acquisition; it is
	// the one teardown path for a failed boot and a normal stop.
	cleanup rollback.Stack

	stopOnce sync.Once
	stopErr  error
}

// SharedDir is the host directory exported to the guest as SharedTag.
func (s *Sandbox) SharedDir() string { return filepath.Join(s.Dir, "shared") }

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

// Boot creates the sandbox directory, starts QEMU and waits for the
// agent. ctx bounds the boot only; the VM lives until Stop. On error
// everything acquired has been released.
func Boot(ctx context.Context, o Options) (_ *Sandbox, retErr error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Tracker == nil {
		o.Tracker = NopTracker{}
	}
	s := &Sandbox{
		ID:       o.ID,
		Dir:      Dir(o.RunDir, o.ID),
		Hostname: o.Hostname,
		log:      o.Log.With("sandbox", o.ID),
		tracker:  o.Tracker,
		cfg:      o.Config,
		dead:     make(chan struct{}),
	}
	defer func() {
		if retErr != nil {
			if err := s.cleanup.Unwind(); err != nil {
				s.log.Warn("rolling back failed boot", "error", err)
			}
		}
	}()
	if err := os.MkdirAll(filepath.Dir(s.Dir), 0o711); err != nil {
		return nil, fmt.Errorf("creating %s: %w", filepath.Dir(s.Dir), err)
	}
	if err := s.tracker.RecordDir(s.Dir); err != nil {
		return nil, err
	}
	if err := os.Mkdir(s.Dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating sandbox directory %s: %w", s.Dir, err)
	}
	s.cleanup.Add("sandbox directory "+s.Dir, func() error { return Release(s.Dir) })
	if err := os.Mkdir(s.SharedDir(), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating shared directory: %w", err)
	}

	h := o.Config.Hypervisor
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
		KernelParams: h.KernelParams,
		Accel:        "auto",
		Shares:       []vm.Share{{Tag: storage.SharedTag, HostPath: s.SharedDir()}},
	}, s.log)
	if err != nil {
		return nil, fmt.Errorf("configuring the VM: %w", err)
	}
	s.vm = hv
	if err := s.tracker.RecordQEMU(0); err != nil {
		return nil, err
	}
	s.cleanup.Add("QEMU", func() error {
		sctx, cancel := context.WithTimeout(context.Background(), stopGrace+2*time.Second)
		defer cancel()
		return hv.Stop(sctx, stopGrace)
	})
	dialTimeout := o.Config.Agent.DialTimeoutDuration()
	if dialTimeout <= 0 {
		dialTimeout = 30 * time.Second
	}
	bootCtx, cancel := context.WithTimeout(ctx, dialTimeout+10*time.Second)
	defer cancel()
	if err := hv.Start(bootCtx); err != nil {
		return nil, fmt.Errorf("starting the VM: %w", err)
	}
	if err := s.tracker.RecordQEMU(hv.Pid()); err != nil {
		return nil, err
	}
	actx, acancel := context.WithTimeout(bootCtx, dialTimeout)
	defer acancel()
	client, ping, err := s.dialAgent(actx)
	if err != nil {
		return nil, s.withConsole(fmt.Errorf("waiting %v for the guest agent: %w", dialTimeout, err))
	}
	s.client = client
	s.bootID = ping.BootId
	s.cleanup.Add("agent connection", func() error {
		// The guest powers itself off: QEMU then exits at once.
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		select {
		case <-hv.Done():
		default:
			_, _ = client.Shutdown(sctx, &agent.Empty{})
		}
		return client.Close()
	})
	go func() {
		<-hv.Done()
		close(s.dead)
	}()
	s.log.Info("sandbox VM ready", "qemu_pid", hv.Pid(), "boot_id", ping.BootId, "kernel", ping.KernelRelease)
	return s, nil
}

// dialAgent waits for the agent, giving up at once if QEMU exits.
func (s *Sandbox) dialAgent(ctx context.Context) (*agentclient.Client, *agent.PingResponse, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.vm.Done():
			cancel(errors.New("the VM exited before its agent answered"))
		case <-ctx.Done():
		}
	}()
	c, ping, err := agentclient.Dial(ctx, s.vm.AgentSocket())
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return nil, nil, cause
		}
		return nil, nil, err
	}
	return c, ping, nil
}

// withConsole appends the tail of the guest console to err.
func (s *Sandbox) withConsole(err error) error {
	b, rerr := os.ReadFile(s.vm.ConsoleLog())
	if rerr != nil || len(b) == 0 {
		return err
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return fmt.Errorf("%w\nguest console (last lines):\n%s", err, b)
}

// Stop powers the VM off and releases every host resource of the
// sandbox. It is idempotent.
func (s *Sandbox) Stop() error {
	s.stopOnce.Do(func() {
		s.stopErr = s.cleanup.Unwind()
		if s.stopErr == nil {
			s.log.Info("sandbox released")
		}
	})
	return s.stopErr
}

// CreateTimeout is runtime.create_container_timeout.
func (s *Sandbox) CreateTimeout() time.Duration {
	return s.cfg.Runtime.CreateContainerTimeoutDuration()
}
