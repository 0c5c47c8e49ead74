// Package container builds and runs OCI containers inside the guest: it
// mounts their storages, creates their cgroups, starts their processes
// through the nsinit helper and the reaper, and tears everything down.
package container

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/cgroup"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/nsinit"
	"github.com/hull-runtime/hull/internal/guest/reaper"
)

// Storage is a filesystem mounted for a container before it is built.
type Storage struct {
	Source, FSType string
	Options        []string
	MountPoint     string
}

// Config configures a Manager.
type Config struct {
	Reaper *reaper.Reaper
	// CgroupRoot is the parent of the containers' cgroups.
	CgroupRoot string
	// Self is the binary re-executed as the nsinit helper.
	Self string
	// PTMX is opened to allocate terminals of containers without a
	// devpts instance of their own.
	PTMX string
	// PtsDir holds each container's devpts instance (PtsDir/<id>).
	PtsDir string
	// PauseDir holds Hull's pause, which CRI sandbox containers run
	// (DefaultPauseDir; "" for their image's command).
	PauseDir string
	Log      *slog.Logger
}

// DefaultPtsDir is where the agent mounts the containers' devpts instances.
const DefaultPtsDir = "/run/hull-agent/pts"

// Manager owns the guest's containers.
type Manager struct {
	cfg Config
	// pause: sandboxes run Hull's pause (Prepare found and sealed it).
	pause bool

	// mu guards containers.
	mu         sync.Mutex
	containers map[string]*Container
}

// NewManager returns a Manager; zero fields of cfg get the guest defaults.
func NewManager(cfg Config) *Manager {
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = cgroup.DefaultRoot
	}
	if cfg.Self == "" {
		cfg.Self = "/proc/self/exe"
	}
	if cfg.PTMX == "" {
		cfg.PTMX = "/dev/ptmx"
	}
	if cfg.PtsDir == "" {
		cfg.PtsDir = DefaultPtsDir
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Manager{cfg: cfg, containers: map[string]*Container{}}
}

// Container is one container.
type Container struct {
	ID     string
	spec   *specs.Spec
	cgroup *cgroup.Cgroup
	log    *slog.Logger

	storages []string // mounted mount points, in mount order
	// pts is the container's devpts instance in the agent's mount
	// namespace ("" without one) and ptmx where its terminals come from.
	pts, ptmx string

	// mu guards the fields below.
	mu      sync.Mutex
	ready   bool // fully created; false while Create runs
	started bool
	init    *Process
	startW  *os.File
	sync    *bufio.Reader
	syncR   *os.File
	nsFDs   map[string]*os.File // mnt, pid, uts, ipc of init (no mnt for a pause)
	execs   map[string]*Process
	pause   bool // a sandbox running Hull's pause
}

// Prepare does ahead what every pod's first container would: it seals
// the pause directory (sandboxes run Hull's pause only once that is done),
// builds the spec's decoding state, creates the containers' cgroup root
// with its controllers and loads the device program of containerd's
// default rules. The agent calls it before it serves, so a VM restored
// from a template starts with all of it done.
func (m *Manager) Prepare() error {
	var err error
	m.pause, err = preparePause(m.cfg.PauseDir)
	return errors.Join(err, m.prepareContainers())
}

// RunsPause says whether sandboxes run Hull's pause (Prepare found it):
// the host then need not share a sandbox's rootfs.
func (m *Manager) RunsPause() bool { return m.pause }

func (m *Manager) prepareContainers() error {
	if err := buildSpecFields(); err != nil {
		return err
	}
	if err := cgroup.PrepareRoot(m.cfg.CgroupRoot); err != nil {
		return err
	}
	if err := cgroup.PreloadDevices(cgroup.DefaultDeviceRules()); err != nil {
		return fmt.Errorf("loading the default device program: %w", err)
	}
	return nil
}

// get returns a ready container.
func (m *Manager) get(id string) (*Container, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.containers[id]
	if !ok || !c.ready {
		return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

// Process returns a container's process ("" for init).
func (m *Manager) Process(id, execID string) (*Process, error) {
	c, err := m.get(id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if execID == "" {
		return c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, fmt.Errorf("process %q of container %q: %w", execID, id, errdefs.ErrNotFound)
	}
	return p, nil
}

// undo is a rollback stack.
type undo []func() error

func (u *undo) push(f func() error) { *u = append(*u, f) }

func (u undo) run() error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		errs = append(errs, u[i]())
	}
	return errors.Join(errs...)
}

func mountStorage(s Storage) error {
	if !filepath.IsAbs(s.MountPoint) {
		return fmt.Errorf("storage mount_point %q must be absolute: %w", s.MountPoint, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(s.MountPoint, 0o755); err != nil {
		return fmt.Errorf("creating storage mount point %s: %w", s.MountPoint, err)
	}
	flags, prop, data := nsinit.ParseMountOptions(s.Options)
	// The share (and every storage) is nosuid,nodev unless its options
	// say "suid" or "dev": a file from the host must not be a set-uid
	// binary or a device node in the guest.
	if !slices.Contains(s.Options, "suid") {
		flags |= unix.MS_NOSUID
	}
	if !slices.Contains(s.Options, "dev") {
		flags |= unix.MS_NODEV
	}
	fstype := s.FSType
	if fstype == "bind" {
		flags |= unix.MS_BIND
		fstype = ""
	}
	if err := unix.Mount(s.Source, s.MountPoint, fstype, flags, data); err != nil {
		return fmt.Errorf("mounting storage %s (%s) on %s: %w", s.Source, s.FSType, s.MountPoint, err)
	}
	if prop != 0 {
		if err := unix.Mount("", s.MountPoint, "", prop, ""); err != nil {
			unix.Unmount(s.MountPoint, unix.MNT_DETACH)
			return fmt.Errorf("setting propagation of %s: %w", s.MountPoint, err)
		}
	}
	return nil
}

func unmount(p string) error {
	err := unix.Unmount(p, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(p, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", p, err)
	}
	return nil
}

// helperPipes are the agent's ends of the helper's config and sync pipes.
type helperPipes struct {
	cfgR, cfgW   *os.File
	syncR, syncW *os.File
}

func newHelperPipes() (*helperPipes, error) {
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating config pipe: %w", err)
	}
	syncR, syncW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		cfgW.Close()
		return nil, fmt.Errorf("creating sync pipe: %w", err)
	}
	return &helperPipes{cfgR, cfgW, syncR, syncW}, nil
}

// sendConfig writes cfg; the pipe buffer may be too small for a large
// spec, so it writes in the background while the helper reads.
func (h *helperPipes) sendConfig(cfg *nsinit.Config) {
	data, _ := json.Marshal(cfg)
	go func() {
		h.cfgW.Write(data)
		h.cfgW.Close()
	}()
}

// namespaces returns the clone flags for the spec's new namespaces. A
// namespace with a path names a host-side namespace that does not exist in
// the guest: the container shares the guest's (the pod's) one instead.
// The network namespace is only unshared when asked for without a path.
// The pid namespace of a pod's containers is podPid's.
func namespaces(s *specs.Spec) (flags uintptr, newUTS bool) {
	flags = unix.CLONE_NEWNS
	if s.Linux == nil {
		return flags | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC, true
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Path != "" {
			continue
		}
		switch ns.Type {
		case specs.PIDNamespace:
			flags |= unix.CLONE_NEWPID
		case specs.UTSNamespace:
			flags |= unix.CLONE_NEWUTS
			newUTS = true
		case specs.IPCNamespace:
			flags |= unix.CLONE_NEWIPC
		case specs.NetworkNamespace:
			flags |= unix.CLONE_NEWNET
		case specs.CgroupNamespace:
			flags |= unix.CLONE_NEWCGROUP
		}
	}
	return flags, newUTS
}

// readResult reads the helper's next message: ready (nil), an error, or
// EOF (exec succeeded: io.EOF is returned).
func readResult(r *bufio.Reader) error {
	msg, err := nsinit.ReadMessage(r)
	if err != nil {
		return err
	}
	switch msg.Type {
	case nsinit.MsgReady:
		return nil
	case nsinit.MsgError:
		if msg.Code != 0 {
			return &errdefs.ExecError{Code: msg.Code, Path: msg.Path, Reason: msg.Reason}
		}
		return errors.New(msg.Reason)
	}
	return fmt.Errorf("unexpected helper message %q", msg.Type)
}

// Create builds a container and leaves its init process waiting before
// exec. It returns the init's pid. On failure nothing is left behind.
func (m *Manager) Create(ctx context.Context, id string, specJSON []byte, storages []Storage, stdin bool, devices ...Device) (pid int, retErr error) {
	if err := ValidateID("container_id", id); err != nil {
		return 0, err
	}
	spec, err := ParseSpec(specJSON)
	if err != nil {
		return 0, err
	}
	c := &Container{ID: id, spec: spec, execs: map[string]*Process{}, log: m.cfg.Log.With("container", id)}
	logIgnoredLSM(c.log, spec.Process)
	m.mu.Lock()
	if _, ok := m.containers[id]; ok {
		m.mu.Unlock()
		return 0, fmt.Errorf("container %q: %w", id, errdefs.ErrAlreadyExists)
	}
	m.containers[id] = c // reserved; not ready
	m.mu.Unlock()

	var u undo
	u.push(func() error {
		m.mu.Lock()
		delete(m.containers, id)
		m.mu.Unlock()
		return nil
	})
	defer func() {
		if retErr != nil {
			if err := u.run(); err != nil {
				c.log.Error("rolling back failed create", "err", err)
			}
		}
	}()

	for _, s := range storages {
		if err := mountStorage(s); err != nil {
			return 0, err
		}
		mp := s.MountPoint
		c.storages = append(c.storages, mp)
		u.push(func() error { return unmount(mp) })
	}

	// The hotplugged disks the devices name, waited for in the guest.
	devs, err := resolveDevices(ctx, devices)
	if err != nil {
		return 0, err
	}

	cg, err := cgroup.Create(m.cfg.CgroupRoot, id)
	if err != nil {
		return 0, err
	}
	c.cgroup = cg
	u.push(cg.Remove)
	if spec.Linux != nil {
		if err := cg.Apply(spec.Linux.Resources); err != nil {
			return 0, fmt.Errorf("applying resources: %w", err)
		}
	}
	rules, err := deviceRules(spec, devs)
	if err != nil {
		return 0, err
	}
	if err := cg.SetDevices(rules); err != nil {
		return 0, err
	}
	sysctls, err := helperSysctls(spec)
	if err != nil {
		return 0, err
	}

	c.ptmx = m.cfg.PTMX
	if m.pause && isSandbox(spec) {
		return m.createPause(c, spec, stdin, &u)
	}
	pts := filepath.Join(m.cfg.PtsDir, id)
	if ok, err := mountPts(pts, spec); err != nil {
		return 0, err
	} else if ok {
		c.pts, c.ptmx = pts, filepath.Join(pts, "ptmx")
		u.push(func() error { return unmountPts(pts) })
	}
	var join []nsJoin
	sid, newPid := podPid(id, spec)
	if sid != "" {
		pidNS, err := m.podPidNS(sid)
		if err != nil {
			return 0, err
		}
		defer pidNS.Close()
		join = append(join, nsJoin{"pid", pidNS.Fd(), unix.CLONE_NEWPID})
	}

	pio, err := newProcIO(spec.Process.Terminal, stdin, c.ptmx)
	if err != nil {
		return 0, err
	}
	pipes, err := newHelperPipes()
	if err != nil {
		pio.closeAll()
		return 0, err
	}
	startR, startW, err := os.Pipe()
	if err != nil {
		pio.closeAll()
		return 0, fmt.Errorf("creating start pipe: %w", err)
	}
	cgFD, err := cg.Open()
	if err != nil {
		pio.closeAll()
		return 0, fmt.Errorf("opening cgroup: %w", err)
	}
	flags, newUTS := namespaces(spec)
	if newPid {
		flags |= unix.CLONE_NEWPID
	}
	hcfg := &nsinit.Config{
		Mode:        nsinit.ModeCreate,
		ContainerID: id,
		Rootfs:      spec.Root.Path,
		Readonly:    spec.Root.Readonly,
		Mounts:      spec.Mounts,
		Hostname:    spec.Hostname,
		SetHostname: newUTS,
		Devices:     devs,
		Devpts:      c.pts,
		Process:     *spec.Process,
	}
	if spec.Linux != nil {
		hcfg.MaskedPaths = spec.Linux.MaskedPaths
		hcfg.ReadonlyPaths = spec.Linux.ReadonlyPaths
		hcfg.Seccomp = spec.Linux.Seccomp
	}
	hcfg.Sysctl = sysctls
	attr := &syscall.ProcAttr{
		Files: append(pio.fds(), pipes.cfgR.Fd(), pipes.syncW.Fd(), startR.Fd()),
		Sys: &syscall.SysProcAttr{
			Cloneflags:  flags,
			UseCgroupFD: true,
			CgroupFD:    int(cgFD.Fd()),
			Setsid:      true,
			Setctty:     pio.hasCtty,
			Ctty:        0,
		},
	}
	initPid, exits, err := m.forkIn(join, m.cfg.Self, []string{"hull-init", nsinit.Arg, nsinit.ModeCreate}, attr)
	cgFD.Close()
	pipes.cfgR.Close()
	pipes.syncW.Close()
	startR.Close()
	pio.closeChild()
	if err != nil {
		pipes.cfgW.Close()
		pipes.syncR.Close()
		startW.Close()
		pio.closeAll()
		return 0, fmt.Errorf("starting container init: %w", err)
	}
	if initPid <= 0 {
		panic("reaper returned no pid")
	}
	var onExit func()
	if flags&unix.CLONE_NEWPID == 0 {
		onExit = func() { killLeftovers(c) }
	}
	proc := newProcess("", initPid, spec.Process.Terminal, pio, exits, onExit)
	u.push(func() error {
		// proc.Pid, not the named result pid, which a failed return zeroes.
		unix.Kill(proc.Pid, unix.SIGKILL)
		<-proc.done
		proc.release()
		startW.Close()
		pipes.syncR.Close()
		return nil
	})
	pipes.sendConfig(hcfg)

	sync := bufio.NewReader(pipes.syncR)
	if err := readResult(sync); err != nil {
		if err == io.EOF {
			e, _ := proc.Wait(ctx)
			err = fmt.Errorf("container init exited with status %d before it was ready", e.Status)
		}
		return 0, fmt.Errorf("creating container: %w", err)
	}
	nsFDs, err := openNamespaces(initPid, "mnt", "pid", "uts", "ipc")
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.init, c.startW, c.sync, c.syncR, c.nsFDs, c.ready = proc, startW, sync, pipes.syncR, nsFDs, true
	c.mu.Unlock()
	c.log.Info("container created", "pid", initPid)
	return initPid, nil
}

// killLeftovers kills what is left in the cgroup of a container that
// shares a pid namespace (the pod's) when its init has exited: no
// namespace ends with it to kill the rest. containerd's runc shim does the
// same before it reports the exit (runc.ShouldKillAllOnExit).
func killLeftovers(c *Container) {
	if err := c.cgroup.Signal(unix.SIGKILL); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("killing the processes its init left", "err", err)
	}
}

// Start lets the init process exec the command. An exec failure is an
// *errdefs.ExecError; the init process then exits with 126 or 127.
func (m *Manager) Start(ctx context.Context, id string) error {
	c, err := m.get(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return fmt.Errorf("container %q already started: %w", id, errdefs.ErrFailedPrecondition)
	}
	if c.init.Exited() {
		return fmt.Errorf("container %q init has exited: %w", id, errdefs.ErrFailedPrecondition)
	}
	c.started = true
	_, err = c.startW.Write([]byte{1})
	c.startW.Close()
	c.startW = nil
	if err != nil {
		return fmt.Errorf("starting container %q: %w", id, err)
	}
	err = readResult(c.sync)
	c.syncR.Close()
	c.syncR, c.sync = nil, nil
	if err == io.EOF {
		c.log.Info("container started", "pid", c.init.Pid)
		return nil
	}
	if err == nil {
		err = errors.New("unexpected ready message")
	}
	return fmt.Errorf("starting container %q: %w", id, err)
}

// Exec starts an additional process in a started container.
func (m *Manager) Exec(ctx context.Context, id, execID string, procJSON []byte, stdin bool) (int, error) {
	if err := ValidateID("exec_id", execID); err != nil {
		return 0, err
	}
	spec, err := ParseProcess(procJSON)
	if err != nil {
		return 0, err
	}
	c, err := m.get(id)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started || c.init.Exited() {
		return 0, fmt.Errorf("container %q is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	if c.pause {
		return 0, errPauseExec(id)
	}
	if _, ok := c.execs[execID]; ok {
		return 0, fmt.Errorf("process %q: %w", execID, errdefs.ErrAlreadyExists)
	}
	pio, err := newProcIO(spec.Terminal, stdin, c.ptmx)
	if err != nil {
		return 0, err
	}
	pipes, err := newHelperPipes()
	if err != nil {
		pio.closeAll()
		return 0, err
	}
	cgFD, err := c.cgroup.Open()
	if err != nil {
		pio.closeAll()
		return 0, fmt.Errorf("opening cgroup: %w", err)
	}
	attr := &syscall.ProcAttr{
		Files: append(pio.fds(), pipes.cfgR.Fd(), pipes.syncW.Fd(), c.nsFDs["mnt"].Fd()),
		Sys: &syscall.SysProcAttr{
			UseCgroupFD: true,
			CgroupFD:    int(cgFD.Fd()),
			Setsid:      true,
			Setctty:     pio.hasCtty,
		},
	}
	// The helper is forked in the container's pid, uts and ipc
	// namespaces, and joins its mount namespace itself.
	var join []nsJoin
	for _, ns := range []struct {
		name string
		flag int
	}{{"pid", unix.CLONE_NEWPID}, {"uts", unix.CLONE_NEWUTS}, {"ipc", unix.CLONE_NEWIPC}} {
		join = append(join, nsJoin{ns.name, c.nsFDs[ns.name].Fd(), ns.flag})
	}
	var r struct {
		pid   int
		exits <-chan reaper.Exit
		err   error
	}
	r.pid, r.exits, r.err = m.forkIn(join, m.cfg.Self, []string{"hull-init", nsinit.Arg, nsinit.ModeExec}, attr)
	cgFD.Close()
	pipes.cfgR.Close()
	pipes.syncW.Close()
	pio.closeChild()
	if r.err != nil {
		pipes.cfgW.Close()
		pipes.syncR.Close()
		pio.closeAll()
		return 0, fmt.Errorf("starting exec process %q: %w", execID, r.err)
	}
	proc := newProcess(execID, r.pid, spec.Terminal, pio, r.exits, nil)
	logIgnoredLSM(c.log, spec)
	hcfg := &nsinit.Config{Mode: nsinit.ModeExec, ContainerID: id, Process: *spec, Seccomp: seccompOf(c.spec)}
	pipes.sendConfig(hcfg)
	err = readResult(bufio.NewReader(pipes.syncR))
	pipes.syncR.Close()
	if err != io.EOF {
		if err == nil {
			err = errors.New("unexpected ready message")
		}
		unix.Kill(r.pid, unix.SIGKILL)
		<-proc.done
		proc.release()
		return 0, fmt.Errorf("exec process %q: %w", execID, err)
	}
	c.execs[execID] = proc
	c.log.Info("exec process started", "exec", execID, "pid", r.pid)
	return r.pid, nil
}

// Signal sends sig to a process, or to every process of the container.
func (m *Manager) Signal(id, execID string, sig unix.Signal, all bool) error {
	c, err := m.get(id)
	if err != nil {
		return err
	}
	if all {
		return c.cgroup.Signal(sig)
	}
	p, err := m.Process(id, execID)
	if err != nil {
		return err
	}
	if p.Exited() {
		return fmt.Errorf("process %q of container %q has exited: %w", execID, id, errdefs.ErrNotFound)
	}
	if err := unix.Kill(p.Pid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("process %q of container %q: %w", execID, id, errdefs.ErrNotFound)
		}
		return fmt.Errorf("signalling pid %d: %w", p.Pid, err)
	}
	return nil
}

// Remove releases a container. Running processes are an error unless force
// (a created but never started container is always removable).
func (m *Manager) Remove(ctx context.Context, id string, force bool) error {
	c, err := m.get(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	procs := []*Process{c.init}
	for _, p := range c.execs {
		procs = append(procs, p)
	}
	started := c.started
	c.mu.Unlock()
	running := false
	for _, p := range procs {
		running = running || !p.Exited()
	}
	if running && started && !force {
		return fmt.Errorf("container %q has running processes: %w", id, errdefs.ErrFailedPrecondition)
	}
	// Every process in the cgroup, also those an exited init left behind
	// (a container without a pid namespace of its own), as runc's delete
	// does: they must not outlive the container, nor keep its cgroup.
	if err := c.cgroup.Signal(unix.SIGKILL); err != nil {
		c.log.Warn("killing container processes", "err", err)
	}
	if running {
		for _, p := range procs {
			unix.Kill(p.Pid, unix.SIGKILL)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, p := range procs {
		if _, err := p.Wait(wctx); err != nil {
			return fmt.Errorf("waiting for process %q of container %q: %w", p.ID, id, err)
		}
	}
	var errs []error
	c.mu.Lock()
	for _, p := range procs {
		p.release()
	}
	for _, f := range c.nsFDs {
		f.Close()
	}
	if c.startW != nil {
		c.startW.Close()
	}
	if c.syncR != nil {
		c.syncR.Close()
	}
	c.mu.Unlock()
	if err := c.cgroup.Remove(); err != nil {
		errs = append(errs, err)
	}
	if c.pts != "" {
		if err := unmountPts(c.pts); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(c.storages) - 1; i >= 0; i-- {
		if err := unmount(c.storages[i]); err != nil {
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	delete(m.containers, id)
	m.mu.Unlock()
	c.log.Info("container removed")
	return errors.Join(errs...)
}

// Pids lists the container's processes.
func (m *Manager) Pids(id string) ([]int, error) {
	c, err := m.get(id)
	if err != nil {
		return nil, err
	}
	return c.cgroup.Procs()
}

// Stats reads the container's cgroup statistics.
func (m *Manager) Stats(id string) (cgroup.Stats, error) {
	c, err := m.get(id)
	if err != nil {
		return cgroup.Stats{}, err
	}
	return c.cgroup.Stats()
}

// Update applies OCI LinuxResources JSON to the container's cgroup.
func (m *Manager) Update(id string, resources []byte) error {
	c, err := m.get(id)
	if err != nil {
		return err
	}
	var r specs.LinuxResources
	if err := json.Unmarshal(resources, &r); err != nil {
		return fmt.Errorf("parsing resources: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return c.cgroup.Apply(&r)
}

// Freeze pauses (true) or resumes (false) the container.
func (m *Manager) Freeze(ctx context.Context, id string, frozen bool) error {
	c, err := m.get(id)
	if err != nil {
		return err
	}
	return c.cgroup.Freeze(ctx, frozen)
}

// IDs lists the containers.
func (m *Manager) IDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id := range m.containers {
		ids = append(ids, id)
	}
	return ids
}
