package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/template"
	"golang.org/x/sys/unix"
)

// Runtime handlers of the harness's containerd.
const (
	HandlerRunc = "runc"
	HandlerHull = "hull"
	// HandlerHullBroken is hull with Options.BrokenHullConfig as its
	// ConfigPath.
	HandlerHullBroken = "hull-broken"
	// HandlerHullFailpoints is hull run from Options.FailpointShim, a
	// shim built with -tags hull_failpoints, with the failpoint
	// annotation passed through from pods and containers.
	HandlerHullFailpoints = "hull-failpoints"
	// HullRuntimeType is the shim's runtime type: containerd runs
	// containerd-shim-hull-v2 from its PATH.
	HullRuntimeType = "io.containerd.hull.v2"
	// CRINamespace is the containerd namespace of CRI's objects.
	CRINamespace = "k8s.io"
)

// Options configure a private containerd.
type Options struct {
	// Dir holds everything of this containerd (root, state, sockets,
	// configuration, logs). Short paths keep socket names within limits.
	Dir string
	// ShimDir, if set, is put first on containerd's PATH (the directory
	// holding containerd-shim-hull-v2).
	ShimDir string
	// HullConfig is the ConfigPath of the "hull" runtime handler, and
	// containerd's HULL_CONFIG (so `ctr run --runtime` finds it too).
	HullConfig string
	// BrokenHullConfig, if set, is the ConfigPath of the "hull-broken"
	// runtime handler.
	BrokenHullConfig string
	// Busybox is the static busybox the test images are built from
	// (default /bin/busybox).
	Busybox string
	// FailpointShim, if set, is the shim binary of the
	// "hull-failpoints" runtime handler (containerd's runtime_path), with
	// HullConfig as its ConfigPath and FailpointAnnotation passed through
	// (pod_annotations, container_annotations).
	FailpointShim string
	// HullHandlers are more runtime handlers of the hull shim, by name,
	// each with its own ConfigPath (e.g. one per internetworking model).
	HullHandlers map[string]string
	// HostDeviceHandlers are more runtime handlers of the hull shim, by
	// name, each with its own ConfigPath, for which containerd lists the
	// host's devices in a privileged container's spec
	// (privileged_without_host_devices = false).
	HostDeviceHandlers map[string]string
	// HandlerPodAnnotations are the pod_annotations (patterns) that the
	// HullHandlers pass to the runtime, e.g. CRI's sizing annotations,
	// which containerd 1.6 does not set itself.
	HandlerPodAnnotations []string
	// CNIBinDir is CRI's CNI plugin directory (default /usr/lib/cni). It
	// must hold loopback and bridge, host-local and CNIChain's plugins.
	CNIBinDir string
	// CNIChain are plugin configurations (JSON objects) chained after
	// the bridge plugin in the network's conflist.
	CNIChain []string
	// Version is the containerd to run; by default the one
	// HULL_CONTAINERD selects (SelectedVersion).
	Version Version
}

// Containerd is a private containerd: its own root, state, sockets, CNI
// configuration and network namespace. It never touches the host's
// default containerd in /run/containerd and /var/lib/containerd.
type Containerd struct {
	Dir, Root, State, Socket, TTRPCSocket, ConfigFile, LogFile string
	CNIConfDir, CNIDataDir                                     string
	// Netns names the network namespace containerd runs in (ip netns);
	// NetnsPath is its bind mount.
	Netns, NetnsPath string
	// StateDir is the state root (runtime.state_dir) of this
	// containerd's Hull handlers: its sandboxes' directories.
	StateDir string

	opts Options
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	// created is when New ran: Close looks for VM templates the host's
	// own state root gained since.
	created time.Time
}

// New prepares a containerd under opts.Dir and creates its network
// namespace; Start runs it. Close undoes both.
func New(opts Options) (*Containerd, error) {
	if opts.Busybox == "" {
		opts.Busybox = "/bin/busybox"
	}
	if opts.Version.Name == "" {
		v, err := SelectedVersion()
		if err != nil {
			return nil, err
		}
		opts.Version = v
	}
	d := opts.Dir
	c := &Containerd{
		Dir:         d,
		Root:        filepath.Join(d, "root"),
		State:       filepath.Join(d, "state"),
		Socket:      filepath.Join(d, "containerd.sock"),
		TTRPCSocket: filepath.Join(d, "containerd.sock.ttrpc"),
		ConfigFile:  filepath.Join(d, "config.toml"),
		LogFile:     filepath.Join(d, "containerd.log"),
		CNIConfDir:  filepath.Join(d, "cni", "net.d"),
		CNIDataDir:  filepath.Join(d, "cni", "data"),
		opts:        opts,
		created:     time.Now(),
	}
	for _, p := range []string{c.Root, c.State, c.CNIConfDir, c.CNIDataDir, filepath.Join(d, "opt")} {
		if err := os.MkdirAll(p, 0o711); err != nil {
			return nil, err
		}
	}
	var rnd [4]byte
	rand.Read(rnd[:])
	c.Netns = "hull-e2e-" + hex.EncodeToString(rnd[:])
	c.NetnsPath = "/run/netns/" + c.Netns
	c.StateDir = stateDirFor(c.Netns)
	if err := useOwnStateDir(&c.opts, d, c.StateDir); err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.ConfigFile, []byte(c.config()), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.CNIConfDir, "10-hull-e2e.conflist"), []byte(c.cniConfig()), 0o644); err != nil {
		return nil, err
	}
	// ip netns add NAME && ip -n NAME link set lo up
	if out, err := exec.Command("ip", "netns", "add", c.Netns).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", c.Netns, err, out)
	}
	if out, err := exec.Command("ip", "-n", c.Netns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		c.deleteNetns()
		return nil, fmt.Errorf("ip -n %s link set lo up: %v: %s", c.Netns, err, out)
	}
	return c, nil
}

// hullHandler writes a CRI runtime handler running Hull with configPath;
// hostDevices is the opposite of containerd's
// privileged_without_host_devices; extra is more TOML lines of the handler.
func hullHandler(b *strings.Builder, runtimes, name, configPath string, hostDevices bool, extra string) {
	fmt.Fprintf(b, `
[%s.%s]
  runtime_type = %q
  privileged_without_host_devices = %t
%s[%s.%s.options]
  ConfigPath = %q
`, runtimes, name, HullRuntimeType, !hostDevices, extra, runtimes, name, configPath)
}

// Version returns the containerd version c runs.
func (c *Containerd) Version() Version { return c.opts.Version }

// HullConfig is the "hull" handler's configuration as this containerd
// passes it: the test's file with the containerd's own state root. A
// client that names a configuration itself (`ctr run
// --runtime-config-path`) must use this one, or its pod's state and VM
// templates land in the host's /run/hull.
func (c *Containerd) HullConfig() string { return c.opts.HullConfig }

// HandlerConfig is, likewise, the configuration this containerd passes
// to the Hull handler name of Options.HullHandlers.
func (c *Containerd) HandlerConfig(name string) string { return c.opts.HullHandlers[name] }

// runtimesTable is the TOML table of CRI's runtime handlers: in the CRI
// plugin of a version 2 configuration (containerd 1.x), in the runtime
// plugin of a version 3 one (containerd 2.x).
func (c *Containerd) runtimesTable() string {
	if c.opts.Version.Major() >= 2 {
		return `plugins."io.containerd.cri.v1.runtime".containerd.runtimes`
	}
	return `plugins."io.containerd.grpc.v1.cri".containerd.runtimes`
}

// tomlStrings writes ss as a TOML array of strings.
func tomlStrings(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func (c *Containerd) config() string {
	o := c.opts
	var b strings.Builder
	if o.Version.Major() >= 2 {
		c.configV3(&b)
	} else {
		c.configV2(&b)
	}
	rt := c.runtimesTable()
	hullHandler(&b, rt, HandlerHull, o.HullConfig, false, "")
	if o.BrokenHullConfig != "" {
		hullHandler(&b, rt, HandlerHullBroken, o.BrokenHullConfig, false, "")
	}
	if o.FailpointShim != "" {
		hullHandler(&b, rt, HandlerHullFailpoints, o.HullConfig, false, fmt.Sprintf(
			"  runtime_path = %q\n  pod_annotations = [%q]\n  container_annotations = [%q]\n",
			o.FailpointShim, FailpointAnnotation, FailpointAnnotation))
	}
	for _, handlers := range []struct {
		configs     map[string]string
		hostDevices bool
	}{{o.HullHandlers, false}, {o.HostDeviceHandlers, true}} {
		names := make([]string, 0, len(handlers.configs))
		for name := range handlers.configs {
			names = append(names, name)
		}
		sort.Strings(names)
		extra := ""
		if !handlers.hostDevices && len(o.HandlerPodAnnotations) > 0 {
			extra = fmt.Sprintf("  pod_annotations = %s\n", tomlStrings(o.HandlerPodAnnotations))
		}
		for _, name := range names {
			hullHandler(&b, rt, name, handlers.configs[name], handlers.hostDevices, extra)
		}
	}
	return b.String()
}

func (c *Containerd) cniBinDir() string {
	if c.opts.CNIBinDir != "" {
		return c.opts.CNIBinDir
	}
	return "/usr/lib/cni"
}

// cniConfig is a bridge with host-local addresses. The bridge lives in
// containerd's own network namespace, so it never touches the host's.
func (c *Containerd) cniConfig() string {
	chain := ""
	for _, p := range c.opts.CNIChain {
		chain += ",\n    " + p
	}
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "hull-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "hull-e2e0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.88.0.0/16"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    }%s
  ]
}
`, c.CNIDataDir, chain)
}

// Start runs containerd in its network namespace and waits until it
// answers on its socket.
func (c *Containerd) Start(ctx context.Context) error {
	if c.cmd != nil {
		return errors.New("containerd is already running")
	}
	log, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "===== harness: starting containerd at %s\n", time.Now().Format(time.RFC3339Nano))
	// nsenter --net=NETNS containerd --config FILE: nsenter execs, so
	// the pid is containerd's; the mount namespace stays the host's, so
	// the runtime's mounts are visible to the leak checks.
	cmd := exec.Command("nsenter", "--net="+c.NetnsPath, "--", c.opts.Version.Bin("containerd"), "--config", c.ConfigFile)
	// Hull's shim first, then the version's own runc shim.
	path := os.Getenv("PATH")
	if c.opts.Version.BinDir != "" {
		path = c.opts.Version.BinDir + ":" + path
	}
	if c.opts.ShimDir != "" {
		path = c.opts.ShimDir + ":" + path
	}
	cmd.Env = append(os.Environ(), "PATH="+path)
	if c.opts.HullConfig != "" {
		cmd.Env = append(cmd.Env, "HULL_CONFIG="+c.opts.HullConfig)
	}
	cmd.Stdout = log
	cmd.Stderr = log
	// Its own process group: a Ctrl-C of the test does not hit it before
	// the cleanup does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting containerd: %w", err)
	}
	c.cmd = cmd
	c.done = make(chan struct{})
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		if err := c.ping(ctx); err == nil {
			return nil
		}
		select {
		case <-c.done:
			c.cmd = nil
			return fmt.Errorf("containerd exited (%v) before it answered; log %s:\n%s", c.err, c.LogFile, tail(c.LogFile, 30))
		case <-ctx.Done():
			c.Stop()
			return fmt.Errorf("containerd did not answer on %s: %w; log:\n%s", c.Socket, ctx.Err(), tail(c.LogFile, 30))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Containerd) ping(ctx context.Context) error {
	if _, err := os.Stat(c.Socket); err != nil {
		return err
	}
	cri, err := Dial(c)
	if err != nil {
		return err
	}
	defer cri.Close()
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = cri.Version(pctx)
	return err
}

// Pid is containerd's process id, 0 when it is not running.
func (c *Containerd) Pid() int {
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// Stop ends containerd: SIGTERM, then SIGKILL after 10 s. Shims keep
// running, as after a real containerd restart.
func (c *Containerd) Stop() error {
	if c.cmd == nil {
		return nil
	}
	defer func() { c.cmd = nil }()
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	c.cmd.Process.Kill()
	<-c.done
	return errors.New("containerd ignored SIGTERM for 10 s and was killed")
}

// Restart stops containerd and starts it again on the same directories.
func (c *Containerd) Restart(ctx context.Context) error {
	if err := c.Stop(); err != nil {
		return err
	}
	return c.Start(ctx)
}

// Ctr runs `ctr --address SOCKET args...` and returns its combined
// output.
func (c *Containerd) Ctr(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--address", c.Socket}, args...)
	out, err := exec.CommandContext(ctx, c.opts.Version.Bin("ctr"), full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ImportTestImages builds TestImages and imports them into the given
// containerd namespaces.
func (c *Containerd) ImportTestImages(ctx context.Context, namespaces ...string) error {
	return c.ImportImages(ctx, "images.tar", TestImages(), namespaces...)
}

// ImportImages builds imgs into an archive named name in containerd's
// directory and imports it into the given containerd namespaces.
func (c *Containerd) ImportImages(ctx context.Context, name string, imgs []Image, namespaces ...string) error {
	archive := filepath.Join(c.Dir, name)
	if err := WriteImagesFile(archive, c.opts.Busybox, imgs); err != nil {
		return err
	}
	for _, ns := range namespaces {
		if _, err := c.Ctr(ctx, "--namespace", ns, "images", "import", "--all-platforms", archive); err != nil {
			return err
		}
	}
	return nil
}

// Close stops containerd, removes its network namespace, its directory
// and its Hull state root. Mounts left under the directory or the root
// are unmounted, and returned as leaks, as is a sandbox directory left in
// the root: after every pod was removed, nothing should be there.
func (c *Containerd) Close() []error {
	var leaks []error
	if err := c.Stop(); err != nil {
		leaks = append(leaks, err)
	}
	if ents, err := os.ReadDir(c.StateDir); err == nil {
		for _, e := range ents {
			if e.Name() == template.DirName {
				// VM templates outlive pods by design; a build still
				// in progress does not.
				leaks = append(leaks, templateBuilds(filepath.Join(c.StateDir, e.Name()))...)
				continue
			}
			leaks = append(leaks, fmt.Errorf("left in Hull's state root: %s", filepath.Join(c.StateDir, e.Name())))
		}
	}
	leaks = append(leaks, hostTemplatesSince(c.created)...)
	mounts := append(mountsUnder(c.Dir), mountsUnder(c.StateDir)...)
	for _, m := range mounts {
		leaks = append(leaks, fmt.Errorf("mount left under containerd's directory: %s", m))
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		unix.Unmount(mounts[i], unix.MNT_DETACH)
	}
	c.deleteNetns()
	for _, dir := range []string{c.Dir, c.StateDir} {
		if err := os.RemoveAll(dir); err != nil {
			leaks = append(leaks, fmt.Errorf("removing %s: %w", dir, err))
		}
	}
	return leaks
}

func (c *Containerd) deleteNetns() {
	// ip netns del NAME
	exec.Command("ip", "netns", "del", c.Netns).Run()
}

// Log returns the last n lines of containerd's log.
func (c *Containerd) Log(n int) string { return tail(c.LogFile, n) }

// LogLines returns the lines of containerd's log (the shims' included)
// that name s, e.g. a container's id: what a test prints when a
// container misbehaves.
func (c *Containerd) LogLines(s string) string {
	b, _ := os.ReadFile(c.LogFile)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) && !strings.Contains(l, "guest console") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func tail(file string, n int) string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// mountsUnder lists the mount points at or under dir, shallowest first.
func mountsUnder(dir string) []string {
	out := leakcheck.Mounts([]string{dir})
	sort.Strings(out) // a parent sorts before what is mounted under it
	return out
}

// templateBuilds are the template builds left in dir (a templates
// directory): a build directory, or a build lock someone holds.
func templateBuilds(dir string) []error {
	var leaks []error
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if strings.HasSuffix(e.Name(), ".build") || strings.HasSuffix(e.Name(), ".lock") && state.LockBusy(p) {
			leaks = append(leaks, fmt.Errorf("VM template build left in Hull's state root: %s", p))
		}
	}
	return leaks
}

// hostTemplatesSince are the VM templates made in the host's own state
// root (/run/hull) since t: a test's pod that ran with a configuration
// other than its containerd's (e.g. `ctr run --runtime-config-path` of
// the test's original file) left them there.
func hostTemplatesSince(t time.Time) []error {
	dir := filepath.Join(config.DefaultRunDir, template.DirName)
	ents, _ := os.ReadDir(dir)
	var leaks []error
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.ModTime().After(t) {
			leaks = append(leaks, fmt.Errorf("VM template made in the host's state root during the test: %s", filepath.Join(dir, e.Name())))
		}
	}
	return leaks
}
