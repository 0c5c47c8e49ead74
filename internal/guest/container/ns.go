package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/cgroup"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/nsinit"
	"github.com/hull-runtime/hull/internal/guest/reaper"
)

// CRI annotations that tell a pod's containers from its sandbox.
const (
	annotationSandboxID     = "io.kubernetes.cri.sandbox-id"
	annotationContainerType = "io.kubernetes.cri.container-type"
)

// podPid returns the id of the sandbox container whose PID namespace a
// pod's container joins, or whether the container gets a new one.
//
// Kubernetes' PID modes reach the guest as: CONTAINER, a pid namespace
// without a path (a new one); POD, a pid namespace with a path (the
// sandbox's, on the host): the container joins the sandbox container's
// namespace in the guest, whose PID 1 is the pause process; NODE
// (hostPID), no pid namespace: the guest's own would expose the agent
// and the kernel threads, so it is mapped to the pod's namespace like
// POD. The sandbox container always gets a new one. A container without
// CRI annotations gets what its spec says, the guest's namespace when it
// names none (`hull run`, docs/hull-run.md).
func podPid(id string, s *specs.Spec) (sandbox string, newNS bool) {
	var pid *specs.LinuxNamespace
	if s.Linux != nil {
		for i, ns := range s.Linux.Namespaces {
			if ns.Type == specs.PIDNamespace {
				pid = &s.Linux.Namespaces[i]
			}
		}
	}
	sid := s.Annotations[annotationSandboxID]
	switch {
	case sid == "":
		return "", pid != nil && pid.Path == ""
	case sid == id || s.Annotations[annotationContainerType] == "sandbox":
		return "", true
	case pid != nil && pid.Path == "":
		return "", true
	}
	return sid, false
}

// podPidNS returns a duplicate of the sandbox container's pid namespace
// descriptor.
func (m *Manager) podPidNS(sid string) (*os.File, error) {
	sb, err := m.get(sid)
	if err != nil {
		return nil, fmt.Errorf("joining the pod's pid namespace: sandbox container %q is not in the guest: %w", sid, errdefs.ErrFailedPrecondition)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	f := sb.nsFDs["pid"]
	if f == nil || sb.init.Exited() {
		return nil, fmt.Errorf("joining the pod's pid namespace: sandbox container %q has exited: %w", sid, errdefs.ErrFailedPrecondition)
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("duplicating the pid namespace of sandbox %q: %w", sid, err)
	}
	return os.NewFile(uintptr(fd), "pidns:"+sid), nil
}

// nsJoin is a namespace the forking thread joins first.
type nsJoin struct {
	name string
	fd   uintptr
	flag int
}

// forkIn starts path (the helper, or the pause) from a thread that has
// joined the namespaces ns (setns(2) of CLONE_NEWPID applies to children
// only). The thread is never unlocked, so it exits with its goroutine
// instead of serving others.
func (m *Manager) forkIn(ns []nsJoin, path string, args []string, attr *syscall.ProcAttr) (int, <-chan reaper.Exit, error) {
	type started struct {
		pid   int
		exits <-chan reaper.Exit
		err   error
	}
	res := make(chan started, 1)
	go func() {
		runtime.LockOSThread()
		for _, n := range ns {
			// nsenter --target ... (setns NSFD FLAG)
			if err := unix.Setns(int(n.fd), n.flag); err != nil {
				res <- started{err: fmt.Errorf("joining %s namespace: %w", n.name, err)}
				return
			}
		}
		pid, exits, err := m.cfg.Reaper.Start(func() (int, error) {
			return syscall.ForkExec(path, args, attr)
		})
		res <- started{pid, exits, err}
	}()
	r := <-res
	return r.pid, r.exits, r.err
}

// ptsOptions is the container's /dev/pts mount from the spec (or the
// default), the options of its devpts instance.
func ptsOptions(s *specs.Spec) (flags uintptr, data string, ok bool) {
	for _, mt := range nsinit.MergeMounts(s.Mounts) {
		if filepath.Clean(mt.Destination) == "/dev/pts" && mt.Type == "devpts" {
			flags, _, data = nsinit.ParseMountOptions(mt.Options)
			return flags &^ unix.MS_RDONLY, data, true
		}
	}
	return 0, "", false
}

// mountPts mounts the container's own devpts instance at dir, from which
// the agent allocates its terminals and which the helper binds on the
// container's /dev/pts: a container sees only its own ptys.
func mountPts(dir string, s *specs.Spec) (bool, error) {
	flags, data, ok := ptsOptions(s)
	if !ok {
		return false, nil // the spec mounts no devpts at /dev/pts
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating devpts mount point %s: %w", dir, err)
	}
	// mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,... devpts DIR
	if err := unix.Mount("devpts", dir, "devpts", flags|unix.MS_NOSUID|unix.MS_NOEXEC, data); err != nil {
		os.Remove(dir)
		return false, fmt.Errorf("mounting the container's devpts on %s (%s): %w", dir, data, err)
	}
	return true, nil
}

func unmountPts(dir string) error {
	err := unmount(dir)
	if rerr := os.Remove(dir); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, fmt.Errorf("removing %s: %w", dir, rerr))
	}
	return err
}

// deviceRules are the device cgroup rules of a container: the spec's,
// then runc's always-allowed list, then its own devices (created with the
// guest's numbers, which the host's rules cannot name). Without a spec
// rule everything but those is denied, as with runc.
//
// A privileged container gets every device of the guest: containerd
// allows them all only when it also lists the host's devices
// (privileged_without_host_devices = false), which Hull's handler does
// not (deploy/containerd-hull.toml); the host's stay on the host.
func deviceRules(s *specs.Spec, own []nsinit.Device) ([]cgroup.DeviceRule, error) {
	if privileged(s) {
		return []cgroup.DeviceRule{{Allow: true, Type: 'a', Major: -1, Minor: -1, Access: "rwm"}}, nil
	}
	var rules []cgroup.DeviceRule
	if s.Linux != nil && s.Linux.Resources != nil {
		r, err := cgroup.SpecDeviceRules(s.Linux.Resources.Devices)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
		}
		rules = r
	}
	rules = append(rules, cgroup.AlwaysAllowed...)
	for _, d := range own {
		rules = append(rules, cgroup.DeviceRule{Allow: true, Type: d.Type[0], Major: d.Major, Minor: d.Minor, Access: "rwm"})
	}
	return rules, nil
}

// privileged says whether a spec is a privileged container's as CRI
// builds it: CAP_SYS_ADMIN in the bounding set and no masked paths (the
// shim's test, internal/device/device.go).
func privileged(s *specs.Spec) bool {
	if s.Process == nil || s.Process.Capabilities == nil || !slices.Contains(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN") {
		return false
	}
	return s.Linux == nil || len(s.Linux.MaskedPaths) == 0
}
