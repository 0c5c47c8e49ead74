// Package qemu runs a Hull VM with QEMU: it builds the command line,
// starts QEMU so that it cannot outlive the caller, talks QMP to it and
// stops it.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hull-runtime/hull/internal/fsguard"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

var _ vm.Hypervisor = (*QEMU)(nil)

const (
	// qmpPollInterval is how often Start retries the QMP socket while
	// QEMU creates it.
	qmpPollInterval = 10 * time.Millisecond
	// powerdownTimeout bounds the QMP command that asks for power-off.
	powerdownTimeout = time.Second
	// killTimeout bounds the wait for a SIGKILLed QEMU to be reaped.
	killTimeout = 10 * time.Second
	// logTail is how much of qemu.log a start error quotes.
	logTail = 2048
)

// QEMU is one VM run by QEMU. Create it with New.
type QEMU struct {
	cfg  vm.Config // validated, defaults filled in
	log  *slog.Logger
	done chan struct{} // closed once QEMU is reaped

	// mu guards the fields below.
	mu      sync.Mutex
	started bool
	proc    *os.Process
	client  *qmp.Client
	exitErr error // cmd.Wait's result, set before done is closed
	// console is closed when the console copier has seen QEMU's stdout
	// end; reap waits for it so the log is complete once done closes.
	console chan struct{}
	tail    consoleTail // the console's last lines

	powerdownOnce sync.Once

	// Hotplugged disks (disk.go).
	hotplugOnce  sync.Once
	hotplugState *hotplug
}

// New validates cfg and returns a VM ready to Start. logger may be nil.
func New(cfg vm.Config, logger *slog.Logger) (*QEMU, error) {
	cfg, err := validate(cfg)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &QEMU{
		cfg:  cfg,
		log:  logger.With("vm", cfg.ID),
		done: make(chan struct{}),
	}, nil
}

// Config returns the validated configuration, with defaults filled in.
func (q *QEMU) Config() vm.Config { return q.cfg }

func (q *QEMU) path(name string) string { return filepath.Join(q.cfg.Dir, name) }

// AgentSocket is the host unix socket connected to the guest's
// hull.agent virtio-serial port.
func (q *QEMU) AgentSocket() string { return q.path(agentSockName) }

// ConsoleLog is the file the guest's ttyS0 is written to.
func (q *QEMU) ConsoleLog() string { return q.path(consoleName) }

// ConsoleLogRotated is the console log before the current one
// (ConsoleLogMax).
func (q *QEMU) ConsoleLogRotated() string { return q.path(consoleName + rotatedSuffix) }

// RootDir is the empty directory QEMU's own root is built on, in its
// mount namespace (internal/fsguard root.go); on the host it stays
// empty. Start creates it and removes it once QEMU has exited.
func (q *QEMU) RootDir() string { return q.path(rootName) }

// LogFile is where QEMU's own stdout and stderr go.
func (q *QEMU) LogFile() string { return q.path(qemuLogName) }

// QMPSocket is QEMU's QMP socket.
func (q *QEMU) QMPSocket() string { return q.path(qmpSockName) }

// Done is closed when QEMU has exited and been reaped.
func (q *QEMU) Done() <-chan struct{} { return q.done }

// Pid is QEMU's process id, 0 before Start.
func (q *QEMU) Pid() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.proc == nil {
		return 0
	}
	return q.proc.Pid
}

// QMP returns the QMP client, nil before Start has succeeded. It is
// closed when QEMU exits or Stop returns.
func (q *QEMU) QMP() *qmp.Client {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.client
}

// Version is QEMU's version, known once Start has succeeded.
func (q *QEMU) Version() qmp.Version {
	if c := q.QMP(); c != nil {
		return c.Version()
	}
	return qmp.Version{}
}

// ExitError is QEMU's exit status (nil for status 0) once Done is closed.
func (q *QEMU) ExitError() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.exitErr
}

// Start launches QEMU and returns once its QMP handshake is done. ctx
// bounds only the start: QEMU keeps running after ctx ends. On error
// QEMU has been killed and reaped.
func (q *QEMU) Start(ctx context.Context) error {
	q.mu.Lock()
	if q.started {
		q.mu.Unlock()
		return errors.New("starting vm: already started")
	}
	q.started = true
	q.mu.Unlock()

	accel, why := resolveAccel(q.cfg.Accel)
	if why != "" {
		// Info, not a warning: a node without usable KVM says so for
		// every pod, and `hull check` / `hull env` report it; `hull run`
		// warns its user itself (AccelFallback).
		q.log.Info(why)
	}
	args := BuildArgs(q.cfg, accel)

	logf, err := os.OpenFile(q.path(qemuLogName), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("starting vm: %w", err)
	}
	consoleR, consoleW, err := consolePipe()
	if err != nil {
		logf.Close()
		return fmt.Errorf("starting vm: console pipe: %w", err)
	}
	consoleLog, err := openRotatingLog(q.path(consoleName), ConsoleLogMax)
	if err != nil {
		logf.Close()
		consoleR.Close()
		consoleW.Close()
		return fmt.Errorf("starting vm: %w", err)
	}
	socks, err := q.listenSockets()
	if err != nil {
		logf.Close()
		consoleR.Close()
		consoleW.Close()
		consoleLog.Close()
		return fmt.Errorf("starting vm: %w", err)
	}
	cmd := exec.Command(q.cfg.Binary, args...)
	cmd.Stdout = consoleW
	cmd.Stderr = logf
	cmd.Dir = q.cfg.Dir
	cmd.Env = Environment()
	cmd.ExtraFiles = append(socks, tapFiles(q.cfg)...) // fds qmpFD, agentFD, NICFirstFD+i
	if q.cfg.Restore != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, q.cfg.Restore) // restoreArgs
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Dies with the thread that forked it (see spawn.go).
		Pdeathsig: syscall.SIGKILL,
		// Out of the caller's process group: a terminal's Ctrl-C does not
		// reach QEMU; the caller stops the VM.
		Setpgid: true,
	}
	// Not root (docs/security.md): a user of its own, with the four
	// capabilities its 9p server needs.
	fsguard.AsUser(cmd.SysProcAttr, UID(q.cfg.ID))
	// spawn's thread confines QEMU (internal/fsguard, docs/security.md):
	// its 9p server makes no device node, setuid/setgid file or file
	// capability on the host for the guest, and a QEMU that falls to the
	// guest reaches no more of the host than this VM's files.
	start := time.Now()
	landlockABI, err := q.spawn(cmd, accel)
	// QEMU has its own copies. The sockets must be QEMU's alone: a
	// connection waiting on one is refused once QEMU has exited.
	logf.Close()
	consoleW.Close()
	closeFiles(socks)
	if err != nil {
		consoleR.Close()
		consoleLog.Close()
		q.removeSockets()
		return fmt.Errorf("starting qemu %s: %w", q.cfg.Binary, err)
	}
	q.console = make(chan struct{})
	go q.copyConsole(consoleR, consoleLog)
	q.mu.Lock()
	q.proc = cmd.Process
	q.mu.Unlock()
	q.log.Info("qemu started", "pid", cmd.Process.Pid, "accel", accel, "machine", q.cfg.MachineType, "landlock", landlockABI)
	if landlockABI == 0 {
		q.log.Warn("this kernel has no Landlock (ABI 2 or later): qemu is confined by its own root, " +
			"user and filters alone, without Landlock's second wall around its files (docs/security.md)")
	}
	q.log.Debug("qemu command line", "args", strings.Join(args, " "))
	go q.reap(cmd)

	c, err := q.connectQMP(ctx)
	if err != nil {
		q.kill()
		<-q.done
		return fmt.Errorf("starting vm %s: %w", q.cfg.ID, err)
	}
	q.mu.Lock()
	q.client = c
	q.mu.Unlock()
	go q.logEvents(c)
	q.log.Info("qmp ready", "qemu", c.Version().String(), "elapsed", time.Since(start).Round(time.Millisecond))
	if q.cfg.Restore != nil {
		if err := q.waitRestored(ctx); err != nil {
			q.kill()
			<-q.done
			return fmt.Errorf("starting vm %s: %w", q.cfg.ID, err)
		}
		q.log.Info("vm restored", "elapsed", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// spawn starts cmd confined (spawn.go) to this VM's policy, on a root
// of its own built on RootDir, which it creates (and removes if QEMU
// could not start).
func (q *QEMU) spawn(cmd *exec.Cmd, accel string) (int, error) {
	if err := os.Mkdir(q.RootDir(), 0o500); err != nil && !errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("qemu's root: %w", err)
	}
	abi, err := spawn(cmd, policy(q.cfg, accel, q.RootDir()), q.done)
	if err != nil {
		os.Remove(q.RootDir())
	}
	return abi, err
}

// reap waits for QEMU and releases what it leaves behind.
func (q *QEMU) reap(cmd *exec.Cmd) {
	err := cmd.Wait()
	<-q.console
	q.mu.Lock()
	q.exitErr = err
	c := q.client
	q.mu.Unlock()
	if c != nil {
		c.Close()
	}
	// A killed QEMU leaves its listening sockets on disk.
	q.removeSockets()
	os.Remove(q.RootDir())
	if err != nil {
		q.log.Info("qemu exited", "status", err.Error())
	} else {
		q.log.Info("qemu exited")
	}
	close(q.done)
}

// listenSockets makes QEMU's QMP and agent sockets, listening, in the
// VM's directory (a stale one from an earlier run is replaced), and
// returns them in the order of qmpFD and agentFD. QEMU accepts on them;
// the host connects by path as before.
func (q *QEMU) listenSockets() ([]*os.File, error) {
	q.removeSockets()
	var files []*os.File
	for _, name := range []string{qmpSockName, agentSockName} {
		f, err := listenUnix(q.path(name))
		if err != nil {
			closeFiles(files)
			q.removeSockets()
			return nil, fmt.Errorf("qemu's %s socket: %w", name, err)
		}
		files = append(files, f)
	}
	return files, nil
}

// listenUnix is a unix socket listening at path, as a file to pass on;
// the socket stays at path when the file is closed.
func listenUnix(path string) (*os.File, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	l.SetUnlinkOnClose(false)
	defer l.Close()
	return l.File()
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

func (q *QEMU) removeSockets() {
	for _, name := range []string{qmpSockName, agentSockName} {
		if err := os.Remove(q.path(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			q.log.Warn("removing socket", "error", err)
		}
	}
}

// connectQMP waits, bounded by ctx, until QEMU accepts on its QMP socket,
// and runs the handshake.
func (q *QEMU) connectQMP(ctx context.Context) (*qmp.Client, error) {
	t := time.NewTicker(qmpPollInterval)
	defer t.Stop()
	for {
		c, err := qmp.Dial(ctx, q.QMPSocket(), q.log)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
			// Connected, but the handshake failed: most likely QEMU is
			// exiting; prefer its own message.
			select {
			case <-q.done:
				return nil, q.exitedDuringStart()
			case <-time.After(200 * time.Millisecond):
				return nil, err
			}
		}
		select {
		case <-q.done:
			return nil, q.exitedDuringStart()
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for qmp: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// exitedDuringStart describes QEMU's early exit with its own message.
func (q *QEMU) exitedDuringStart() error {
	msg := "no output"
	if b, err := readTail(q.path(qemuLogName), logTail); err == nil && len(b) > 0 {
		msg = strings.TrimSpace(string(b))
	}
	return fmt.Errorf("qemu exited during start (%v): %s", q.ExitError(), msg)
}

func readTail(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart)
	}
	return io.ReadAll(f)
}

func (q *QEMU) logEvents(c *qmp.Client) {
	for ev := range c.Events() {
		switch ev.Name {
		case "SHUTDOWN", "RESET", "GUEST_PANICKED", "POWERDOWN":
			q.log.Info("qemu event", "event", ev.Name, "data", string(ev.Data))
		default:
			q.log.Debug("qemu event", "event", ev.Name, "data", string(ev.Data))
		}
	}
}

// kill sends SIGKILL to QEMU. os.Process holds a pidfd, so a process
// already reaped is never confused with a recycled pid.
func (q *QEMU) kill() {
	q.mu.Lock()
	p := q.proc
	q.mu.Unlock()
	if p != nil {
		if err := p.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			q.log.Warn("killing qemu", "error", err)
		}
	}
}

// Stop asks the guest to power off (ACPI power button; QMP quit when
// the guest cannot act on it), waits until QEMU exits, at most until
// ctx's deadline or grace, whichever is sooner (grace <= 0: ctx's
// deadline only, or no wait when ctx has none), then kills QEMU and waits until it is reaped. It is
// idempotent, safe to call concurrently and after QEMU died, and does
// not remove the VM's directory.
func (q *QEMU) Stop(ctx context.Context, grace time.Duration) error {
	q.mu.Lock()
	started := q.proc != nil
	q.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-q.done:
		return nil
	default:
	}

	q.powerdownOnce.Do(func() { q.powerdown(ctx) })

	var timeout <-chan time.Time // nil: ctx alone bounds the wait
	if _, ok := ctx.Deadline(); grace > 0 || !ok {
		t := time.NewTimer(max(grace, 0))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-q.done:
		return nil
	case <-ctx.Done():
	case <-timeout:
	}

	q.log.Warn("qemu still running after grace; killing it", "grace", grace)
	q.kill()
	select {
	case <-q.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("stopping vm %s: qemu pid %d not reaped %v after SIGKILL", q.cfg.ID, q.Pid(), killTimeout)
	}
}

// powerdown sends system_powerdown, or quit when the guest cannot power
// off by itself (ACPI off, or not running: panicked, paused, ...).
func (q *QEMU) powerdown(ctx context.Context) {
	c := q.QMP()
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), powerdownTimeout)
	defer cancel()
	cmd := "system_powerdown"
	if hasParam(q.cfg.KernelParams, "acpi") && strings.Contains(strings.Join(q.cfg.KernelParams, " "), "acpi=off") {
		cmd = "quit"
	} else {
		var st struct {
			Running bool   `json:"running"`
			Status  string `json:"status"`
		}
		if err := c.Execute(ctx, "query-status", nil, &st); err == nil && !st.Running {
			q.log.Info("guest not running; quitting qemu", "status", st.Status)
			cmd = "quit"
		}
	}
	if err := c.Execute(ctx, cmd, nil, nil); err != nil && !errors.Is(err, qmp.ErrClosed) {
		q.log.Warn("asking qemu to stop", "command", cmd, "error", err)
	}
}

// InjectNMI sends the guest an NMI (QMP inject-nmi): with
// unknown_nmi_panic on the kernel command line the guest kernel panics.
// For the fault-injection tests.
func (q *QEMU) InjectNMI(ctx context.Context) error {
	c := q.QMP()
	if c == nil {
		return errors.New("injecting an NMI: no QMP connection")
	}
	if err := c.Execute(ctx, "inject-nmi", nil, nil); err != nil {
		return fmt.Errorf("injecting an NMI: %w", err)
	}
	return nil
}
