package run

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/rollback"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// Timeouts of the steps that talk to the VM.
const (
	bootTimeout     = 60 * time.Second // QEMU start to agent answering (TCG is slow)
	rpcTimeout      = 30 * time.Second
	drainTimeout    = 5 * time.Second // output still arriving after the exit
	stopGrace       = 5 * time.Second // guest power-off before SIGKILL
	shutdownTimeout = 3 * time.Second
)

// Stdio is where the command's streams go.
type Stdio struct {
	In       io.Reader
	Out, Err io.Writer
}

// Runner runs one command in one VM.
type Runner struct {
	opts  Options
	stdio Stdio
	log   *slog.Logger
	// Timings of the last run, for `make bench-boot`.
	Timings Timings

	vm      *qemu.QEMU
	client  *agentclient.Client
	cleanup rollback.Stack
}

// Timings are the parts of one run, measured on the host.
type Timings struct {
	QEMUStart    time.Duration `json:"qemu_start"`    // exec to QMP answering
	AgentReady   time.Duration `json:"agent_ready"`   // QMP answering to agent Ping answered
	GuestReady   time.Duration `json:"guest_ready"`   // guest kernel start to agent channel open (guest clock)
	ProcessStart time.Duration `json:"process_start"` // agent ready to the command started
	Command      time.Duration `json:"command"`       // command started to its exit
	Teardown     time.Duration `json:"teardown"`      // exit to everything released
	Total        time.Duration `json:"total"`
}

// New returns a runner; Run does the work.
func New(opts Options, stdio Stdio, log *slog.Logger) *Runner {
	return &Runner{opts: opts, stdio: stdio, log: log}
}

// Run boots the VM, runs the command and tears everything down. It
// returns the command's exit status, or 125/126/127 with an error when the
// command could not be run.
func (r *Runner) Run(ctx context.Context) (int, error) {
	if err := r.opts.Validate(); err != nil {
		return ExitRunFailed, err
	}
	start := time.Now()
	code, err := r.run(ctx)
	tdStart := time.Now()
	if terr := r.cleanup.Unwind(); terr != nil {
		err = errors.Join(err, fmt.Errorf("tearing down: %w", terr))
		if code == 0 {
			code = ExitRunFailed
		}
	}
	r.Timings.Teardown = time.Since(tdStart)
	r.Timings.Total = time.Since(start)
	return code, err
}

// runAccel is hull run's accelerator: KVM when usable, else TCG, which
// it warns its user of (the QEMU driver only logs it).
const runAccel = "auto"

func (r *Runner) run(ctx context.Context) (int, error) {
	id, err := newID()
	if err != nil {
		return ExitRunFailed, err
	}
	log := r.log.With("vm", id)
	dir := filepath.Join(r.opts.RunDir, id)
	if err := os.MkdirAll(r.opts.RunDir, 0o711); err != nil {
		return ExitRunFailed, fmt.Errorf("creating run directory %s: %w", r.opts.RunDir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return ExitRunFailed, fmt.Errorf("creating VM directory %s: %w", dir, err)
	}
	r.cleanup.Add("VM directory "+dir, func() error { return os.RemoveAll(dir) })

	hv, err := qemu.New(vm.Config{
		ID:           id,
		Dir:          dir,
		Binary:       r.opts.QEMU,
		MachineType:  r.opts.MachineType,
		Firmware:     r.opts.Firmware,
		VCPUs:        r.opts.CPUs,
		MemoryMiB:    r.opts.MemoryMiB,
		TCGCacheMiB:  r.opts.TCGCacheMiB,
		Kernel:       r.opts.Kernel,
		Initrd:       r.opts.Initrd,
		KernelParams: r.opts.KernelParams,
		Accel:        runAccel,
		Shares:       []vm.Share{{Tag: rootfsTag, HostPath: r.opts.Rootfs}},
		// With --debug the guest console streams to stderr as it comes.
		ConsoleOutput: r.consoleOutput(),
	}, r.log)
	if err != nil {
		return ExitRunFailed, err
	}
	r.vm = hv
	// The console log is read after the VM is gone when the guest failed.
	r.cleanup.Add("QEMU", func() error {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopGrace+2*time.Second)
		defer cancel()
		return hv.Stop(sctx, stopGrace)
	})
	if why := qemu.AccelFallback(runAccel); why != "" {
		log.Warn(why)
	}
	t0 := time.Now()
	bootCtx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	if err := hv.Start(bootCtx); err != nil {
		return ExitRunFailed, fmt.Errorf("starting the VM: %w", err)
	}
	r.Timings.QEMUStart = time.Since(t0)
	t1 := time.Now()
	client, ping, err := agentclient.Dial(bootCtx, hv.AgentSocket(), hv.Done())
	if err != nil {
		return ExitRunFailed, r.withConsole(err)
	}
	r.client = client
	r.cleanup.Add("agent connection", func() error {
		// Ask the guest to power off first: QEMU then exits by itself and
		// Stop needs no ACPI round trip or grace period.
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		_, _ = client.Shutdown(sctx, &agent.Empty{})
		return client.Close()
	})
	r.Timings.AgentReady = time.Since(t1)
	r.Timings.GuestReady = time.Duration(ping.ReadyNs)
	log.Debug("agent ready", "kernel", ping.KernelRelease, "boot_id", ping.BootId)
	// Everything QEMU needs on disk is open now: remove the directory so
	// that not even a SIGKILL of this process can leave it behind.
	if err := os.RemoveAll(dir); err != nil {
		return ExitRunFailed, fmt.Errorf("removing VM directory %s: %w", dir, err)
	}

	return r.runCommand(ctx)
}

// runCommand creates, starts and waits for the command.
func (r *Runner) runCommand(ctx context.Context) (int, error) {
	t0 := time.Now()
	spec, err := buildSpec(&r.opts)
	if err != nil {
		return ExitRunFailed, err
	}
	rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err = r.client.CreateContainer(rctx, &agent.CreateContainerRequest{
		ContainerId: containerID,
		OciSpec:     spec,
		Storages:    []*agent.Storage{rootfsStorage()},
		Stdin:       r.opts.Interactive,
	})
	if err != nil {
		if ee, ok := agentclient.AsExecError(err); ok {
			return ee.Code, fmt.Errorf("%s", ee.Error())
		}
		return ExitRunFailed, r.withConsole(fmt.Errorf("creating the container: %s", agentclient.Message(err)))
	}
	r.cleanup.Add("container", func() error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rpcTimeout)
		defer cancel()
		_, err := r.client.RemoveContainer(rctx, &agent.RemoveContainerRequest{ContainerId: containerID, Force: true})
		if err != nil && !agentclient.IsNotFound(err) {
			return err
		}
		return nil
	})

	term, err := r.setupTerminal(ctx)
	if err != nil {
		return ExitRunFailed, err
	}
	if term != nil {
		r.cleanup.Add("terminal mode", term.restore)
	}

	// Output pumps start before the command so that nothing is missed.
	var pumps sync.WaitGroup
	pumpErrs := make(chan error, 2)
	pump := func(s agentclient.Stream, w io.Writer) {
		defer pumps.Done()
		if err := r.client.CopyOut(context.WithoutCancel(ctx), containerID, "", s, w); err != nil {
			pumpErrs <- err
		}
	}
	pumps.Add(2)
	go pump(agentclient.Stdout, r.stdio.Out)
	go pump(agentclient.Stderr, r.stdio.Err)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)

	if _, err := r.client.StartContainer(rctx, &agent.ContainerRequest{ContainerId: containerID}); err != nil {
		if ee, ok := agentclient.AsExecError(err); ok {
			return ee.Code, fmt.Errorf("%s", ee.Error())
		}
		return ExitRunFailed, r.withConsole(fmt.Errorf("starting the container: %s", agentclient.Message(err)))
	}
	r.Timings.ProcessStart = time.Since(t0)
	tStarted := time.Now()
	if r.opts.Interactive && r.stdio.In != nil {
		go func() {
			if err := r.client.CopyIn(context.WithoutCancel(ctx), containerID, "", r.stdio.In); err != nil {
				r.log.Debug("stdin", "error", err)
			}
		}()
	}

	waited := make(chan *agent.WaitProcessResponse, 1)
	waitErr := make(chan error, 1)
	go func() {
		resp, err := r.client.WaitProcess(context.WithoutCancel(ctx), &agent.ProcessRequest{ContainerId: containerID})
		if err != nil {
			waitErr <- err
			return
		}
		waited <- resp
	}()

	for {
		select {
		case sig := <-sigs:
			r.forward(ctx, sig.(syscall.Signal))
		case <-term.resized():
			term.sendSize(ctx, r.client)
		case <-r.vm.Done():
			return ExitRunFailed, r.withConsole(errors.New("the VM exited while the command was running"))
		case err := <-waitErr:
			return ExitRunFailed, r.withConsole(fmt.Errorf("waiting for the command: %w", err))
		case resp := <-waited:
			r.Timings.Command = time.Since(tStarted)
			r.drain(&pumps, pumpErrs)
			return int(resp.ExitStatus), nil
		}
	}
}

// forward sends a signal the user gave hull to the command.
func (r *Runner) forward(ctx context.Context, sig syscall.Signal) {
	rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err := r.client.SignalProcess(rctx, &agent.SignalProcessRequest{ContainerId: containerID, Signal: uint32(sig)})
	if err != nil && !agentclient.IsNotFound(err) {
		r.log.Warn("forwarding signal", "signal", sig, "error", err)
	}
}

// drain waits for the output still in flight after the exit.
func (r *Runner) drain(pumps *sync.WaitGroup, errs <-chan error) {
	done := make(chan struct{})
	go func() { pumps.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drainTimeout):
		r.log.Warn("output still open after the command exited; giving up on it", "after", drainTimeout)
	}
	select {
	case err := <-errs:
		r.log.Warn("copying output", "error", err)
	default:
	}
}

// consoleOutput prints the guest console to stderr when debugging.
func (r *Runner) consoleOutput() func(string) {
	if !r.opts.Debug {
		return nil
	}
	return func(line string) { fmt.Fprintf(r.stdio.Err, "guest: %s\n", line) }
}

// withConsole adds the guest console's last lines to err: a guest
// failure is visible from the host.
func (r *Runner) withConsole(err error) error {
	if r.vm == nil {
		return err
	}
	return vm.WithConsole(err, r.vm.ConsoleTail(20))
}

func newID() (string, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("making a VM id: %w", err)
	}
	return "run-" + hex.EncodeToString(b[:]), nil
}
