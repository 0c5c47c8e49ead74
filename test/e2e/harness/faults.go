package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/leakcheck"
)

// FailpointAnnotation arms failpoints in a shim built with -tags
// hull_failpoints (see internal/failpoint).
const FailpointAnnotation = failpoint.Annotation

// Kill ends containerd with SIGKILL, as a crash would: it cleans up
// nothing, and its shims keep running. Start brings it back on the same
// directories.
func (c *Containerd) Kill() error {
	if c.cmd == nil {
		return errors.New("containerd is not running")
	}
	defer func() { c.cmd = nil }()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing containerd: %w", err)
	}
	<-c.done
	log, err := os.OpenFile(c.LogFile, os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		fmt.Fprintf(log, "===== harness: containerd killed (SIGKILL) at %s\n", time.Now().Format(time.RFC3339Nano))
		log.Close()
	}
	return nil
}

// PodOptions are the less common settings of a pod.
type PodOptions struct {
	// Annotations of the pod sandbox (containerd passes those listed in
	// the handler's pod_annotations to the runtime).
	Annotations map[string]string
	// Privileged makes the sandbox privileged, so that its containers
	// may be.
	Privileged bool
}

// RunPodWith is RunPod with options.
func (c *CRI) RunPodWith(ctx context.Context, name, handler, logDir string, o PodOptions) (*Pod, error) {
	cfg := podConfig(name, logDir)
	cfg.Annotations = o.Annotations
	cfg.Linux.SecurityContext.Privileged = o.Privileged
	resp, err := c.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		return nil, err
	}
	return &Pod{ID: resp.PodSandboxId, Config: cfg, Handler: handler, LogDir: logDir}, nil
}

// RemoveAllPods stops and removes every pod containerd's CRI lists, as a
// kubelet converging on "no pods" would, and returns the ids of the pods
// and of their containers.
func (c *CRI) RemoveAllPods(ctx context.Context) ([]string, error) {
	pods, err := c.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	var ids []string
	var errs []error
	for _, p := range pods.Items {
		cts, _ := c.PodContainers(ctx, p.Id)
		ids = append(ids, cts...)
		ids = append(ids, p.Id)
		if err := c.RemovePod(ctx, p.Id); err != nil {
			errs = append(errs, err)
		}
	}
	return ids, errors.Join(errs...)
}

// PodShim returns the hull shim process that serves the pod (its first
// task is the sandbox, so it runs with `-id <pod id>`).
func (c *Containerd) PodShim(podID string) (leakcheck.Process, bool) {
	for _, p := range c.ShimProcesses("containerd-shim-hull-v2") {
		if strings.Contains(p.Cmdline, "-id "+podID) {
			return p, true
		}
	}
	return leakcheck.Process{}, false
}

// PodQEMU returns the QEMU process of the pod's VM.
func (c *Containerd) PodQEMU(podID string) (leakcheck.Process, bool) {
	for _, p := range leakcheck.Processes([]string{podID}) {
		if strings.Contains(strings.Fields(p.Cmdline)[0], "qemu-system") {
			return p, true
		}
	}
	return leakcheck.Process{}, false
}

// idInLog finds the ids in containerd 1.6's CRI debug log: `generated
// id for sandbox name "…" podsandboxid=<id>` (and the podsandboxid field
// of every sandbox line), `Generated id "<id>" for container "…"`, the
// "returns … id" lines.
var idInLog = regexp.MustCompile(`(?:Generated id|for sandbox|returns sandbox id|returns container id) \\?"([0-9a-f]{64})\\?"|podsandboxid=([0-9a-f]{64})`)

// LoggedIDs lists the sandbox and container ids containerd's CRI generated
// (from its debug log), failed creations included: the ids to check for
// residue when a RunPodSandbox or CreateContainer returned none.
func (c *Containerd) LoggedIDs() []string {
	b, _ := os.ReadFile(c.LogFile)
	seen := map[string]bool{}
	var ids []string
	for _, m := range idInLog.FindAllSubmatch(b, -1) {
		id := string(m[1]) + string(m[2])
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids
}

// Leftovers lists what is left on the host of every pod and container
// this containerd ever created (LoggedIDs): Residue for all of them, plus
// any shim still serving this containerd, any QEMU of one, mounts under
// containerd's directory, and CNI address leases. It is empty once every
// pod was removed.
func (c *Containerd) Leftovers(wait time.Duration) []error {
	deadline := time.Now().Add(wait)
	for {
		errs := c.leftoversOnce()
		if len(errs) == 0 || time.Now().After(deadline) {
			return errs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Containerd) leftoversOnce() []error {
	errs := c.residueOnce(c.LoggedIDs(), nil)
	for _, p := range c.ShimProcesses("containerd-shim") {
		errs = append(errs, fmt.Errorf("shim still serving containerd: %d %s", p.Pid, p.Cmdline))
	}
	for _, p := range c.QEMUProcesses() {
		errs = append(errs, fmt.Errorf("QEMU still running under a shim of containerd: %d %s", p.Pid, p.Cmdline))
	}
	for _, m := range mountsUnder(c.Dir) {
		errs = append(errs, fmt.Errorf("mount under containerd's directory: %s", m))
	}
	// host-local keeps one file per leased address (and
	// last_reserved_ip.N, lock); CNI DEL removes the lease.
	leases, _ := filepath.Glob(filepath.Join(c.CNIDataDir, "*", "*"))
	for _, l := range leases {
		base := filepath.Base(l)
		if base == "lock" || strings.HasPrefix(base, "last_reserved_ip") {
			continue
		}
		errs = append(errs, fmt.Errorf("CNI address still leased: %s", l))
	}
	return errs
}

// CPUTime is a process's user plus system CPU time so far (utime and
// stime of /proc/<pid>/stat).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	// Fields after the command: state(3) ppid ... utime(14) stime(15).
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	// USER_HZ is 100 on every Linux architecture Hull runs on.
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// ShimsCPU is the total CPU time of the hull shims serving this
// containerd, and how many there are.
func (c *Containerd) ShimsCPU() (time.Duration, int) {
	var total time.Duration
	n := 0
	for _, p := range c.ShimProcesses("containerd-shim-hull-v2") {
		if d, err := CPUTime(p.Pid); err == nil {
			total += d
			n++
		}
	}
	return total, n
}

// ProcessGone says whether pid has exited (or is a zombie).
func ProcessGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// WaitGone polls (every 20 ms) until pid is gone and returns how long it
// took, or an error when it still runs after limit.
func WaitGone(pid int, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for !ProcessGone(pid) {
		if time.Since(start) > limit {
			return time.Since(start), fmt.Errorf("process %d still running after %v", pid, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start), nil
}

// Runs is how many times the threads of a process have been put on a CPU
// so far (the third field of /proc/<pid>/task/*/schedstat): its wake-ups,
// for a process that mostly sleeps. Threads that exited are not counted.
func Runs(pid int) (int64, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue
		}
		v, err := strconv.ParseInt(f[2], 10, 64)
		if err == nil {
			n += v
		}
	}
	return n, nil
}
