// Package faults is issue 5's fault-injection suite: pods run through a
// real containerd (Debian's 1.6.20) over CRI, with QEMU, and then things
// die — the shim, QEMU, the guest, containerd — or fail at a chosen step
// (failpoints); after each test nothing of its pods may be left on the
// host. It also runs the churn (many pods created and removed in rounds)
// and checks `hull gc` after a shim and its QEMU were killed together.
//
// Prerequisites are those of test/e2e/cri (root, containerd, runc, the CNI
// plugins, a static /bin/busybox, QEMU, HULL_BIN with
// containerd-shim-hull-v2 next to it, HULL_TEST_KERNEL, HULL_TEST_INITRD).
// The failpoint tests also need a shim built with -tags hull_failpoints:
// HULL_FAILPOINT_SHIM (set by `make test`), or bin-failpoints/ next to
// HULL_BIN's directory (`make shim-failpoints`). Without a prerequisite
// the tests skip and say why; with HULL_E2E=1 they fail instead (the
// failpoint tests when HULL_FAILPOINT_SHIM names a missing file).
//
// The churn's size: HULL_CHURN_PODS (default 50), HULL_CHURN_BATCH (10),
// HULL_CHURN_ROUNDS (3); HULL_CHURN_PODS=0 skips it.
package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

const shimName = harness.ShimName

// guestMemoryMiB is the guest memory of the suite's pods: small, so that
// the churn's ten VMs booting at once fit anywhere.
const guestMemoryMiB = 128

// agentDialTimeout (seconds) rides out the churn's boots: ten TCG boots at
// once next to dozens of idle guests on two shared cores took 33 s (p50)
// until the container ran, and the default (30 s) failed 9-19 of 50 boots
// a round with "waiting 30s for the guest agent".
const agentDialTimeout = 120

var (
	skipReason    string // why no test here can run, "" when they can
	hullBin       string
	shimDir       string
	kernel        string
	initrd        string
	failpointShim string // "" when there is none
	failpointSkip string // why there is none
)

func prerequisites() string {
	if why := harness.BasePrerequisites(); why != "" {
		return why
	}
	a, why := harness.HullAssets()
	hullBin, shimDir, kernel, initrd = a.Hull, a.ShimDir, a.Kernel, a.Initrd
	return why
}

// findFailpointShim returns the failpoint shim, or "" and why there is
// none.
func findFailpointShim() (string, string) {
	if p := os.Getenv("HULL_FAILPOINT_SHIM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Sprintf("HULL_FAILPOINT_SHIM: %v (make shim-failpoints)", err)
		}
		abs, _ := filepath.Abs(p)
		return abs, ""
	}
	// make shim-failpoints: out/bin-failpoints next to out/bin.
	p := filepath.Join(filepath.Dir(filepath.Dir(hullBin)), "bin-failpoints", shimName)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Sprintf("needs a shim built with -tags hull_failpoints: HULL_FAILPOINT_SHIM, or %s (make shim-failpoints)", p)
	}
	abs, _ := filepath.Abs(p)
	return abs, ""
}

func TestMain(m *testing.M) {
	skipReason = prerequisites()
	if skipReason == "" {
		failpointShim, failpointSkip = findFailpointShim()
	}
	os.Exit(m.Run())
}

func requireHull(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, "fault-injection test: "+skipReason)
	}
}

func requireFailpoints(t *testing.T) {
	t.Helper()
	requireHull(t)
	if failpointShim == "" {
		// make test sets HULL_FAILPOINT_SHIM: a missing binary then
		// fails; without it the failpoint tests skip.
		if os.Getenv("HULL_FAILPOINT_SHIM") != "" {
			testenv.Require(t, "failpoint test: "+failpointSkip)
		}
		t.Skip("failpoint test: " + failpointSkip)
	}
}

// env is one test's private containerd with its CRI client.
type env struct {
	t       *testing.T
	dir     string
	ctd     *harness.Containerd
	cri     *harness.CRI
	logRoot string
}

// newEnv starts a private containerd for t (with the "hull" handler and,
// when there is a failpoint shim, "hull-failpoints") and the test images.
// At cleanup every pod CRI still lists is stopped and removed, and then
// nothing of any pod or container this containerd ever created may be
// left on the host (harness.Leftovers), nor any process or mount under
// the test's directory.
func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvShim(t, shimDir)
}

// newFailpointEnv is newEnv with the failpoint shim for every hull
// handler: containerd 1.6.20 ignores the handler's runtime_path and runs
// containerd-shim-hull-v2 from its PATH. Unarmed, it behaves as the
// production shim.
func newFailpointEnv(t *testing.T) *env {
	t.Helper()
	return newEnvShim(t, filepath.Dir(failpointShim))
}

func newEnvShim(t *testing.T, shimDir string) *env {
	t.Helper()
	dir, err := os.MkdirTemp("", "hull-fi-")
	if err != nil {
		t.Fatal(err)
	}
	leakcheck.Register(t, dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, dir: dir, logRoot: filepath.Join(dir, "pods")}
	cfg := filepath.Join(dir, "hull.toml")
	writeFile(t, cfg, fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\ndefault_memory = %d\n\n[agent]\ndial_timeout = %d\n",
		kernel, initrd, guestMemoryMiB, agentDialTimeout))
	ctd, cri := harness.LaunchT(t, harness.Options{
		Dir: filepath.Join(dir, "ctd"), ShimDir: shimDir, HullConfig: cfg, FailpointShim: failpointShim,
	}, 80, nil)
	e.ctd, e.cri = ctd, cri
	t.Cleanup(func() {
		if ctd.Pid() == 0 {
			// A test that killed containerd and failed before it
			// started it again.
			if err := ctd.Start(context.Background()); err != nil {
				t.Errorf("starting containerd for the cleanup: %v", err)
				return
			}
		}
		ids, err := cri.RemoveAllPods(e.ctx(3 * time.Minute))
		if err != nil {
			t.Errorf("removing every pod at cleanup: %v", err)
		}
		if len(ids) > 0 {
			t.Logf("cleanup removed %d pods and containers the test left", len(ids))
		}
		e.checkLeftovers("at the end of the test")
	})
	return e
}

// checkLeftovers fails the test for anything left of any pod or
// container of the test's containerd.
func (e *env) checkLeftovers(when string) {
	e.t.Helper()
	for _, err := range e.ctd.Leftovers(15 * time.Second) {
		e.t.Errorf("leak %s: %v", when, err)
	}
}

func writeFile(t *testing.T, name, s string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ctx is a context bounded by limit, cancelled when the test ends.
func (e *env) ctx(limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	e.t.Cleanup(cancel)
	return ctx
}

// runPod runs a pod with handler and returns it with its netns.
func (e *env) runPod(name, handler string, o harness.PodOptions) (*harness.Pod, string) {
	t := e.t
	t.Helper()
	logDir := filepath.Join(e.logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := e.ctx(3 * time.Minute)
	start := time.Now()
	pod, err := e.cri.RunPodWith(ctx, name, handler, logDir, o)
	if err != nil {
		t.Fatalf("RunPodSandbox %s (handler %s): %v", name, handler, err)
	}
	t.Logf("RunPodSandbox %s: %s in %v", name, pod.ID, time.Since(start).Round(time.Millisecond))
	netns, _ := e.cri.PodNetns(ctx, pod.ID)
	return pod, netns
}

// startRunning creates and starts ct in pod and waits until it runs.
func (e *env) startRunning(pod *harness.Pod, ct harness.Container) string {
	t := e.t
	t.Helper()
	ctx := e.ctx(3 * time.Minute)
	id, err := e.cri.StartNew(ctx, pod, ct)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cri.WaitState(ctx, id, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
		t.Fatal(err)
	}
	return id
}

// sleeper is a container that runs until it is killed.
func sleeper(name string) harness.Container {
	return harness.Container{Name: name, Command: []string{"sh", "-c", "echo up-" + name + "; exec sleep 2147483647"}}
}

// podWithVM runs a pod with two sleeping containers and returns it with
// its containers, netns, shim and QEMU processes.
func (e *env) podWithVM(name string, o harness.PodOptions, cts ...harness.Container) (pod *harness.Pod, ids []string, netns string, shimPid, qemuPid int) {
	t := e.t
	t.Helper()
	pod, netns = e.runPod(name, harness.HandlerHull, o)
	if len(cts) == 0 {
		cts = []harness.Container{sleeper("a"), sleeper("b")}
	}
	for _, ct := range cts {
		ids = append(ids, e.startRunning(pod, ct))
	}
	shim, ok := e.ctd.PodShim(pod.ID)
	if !ok {
		t.Fatalf("no hull shim runs with -id %s", pod.ID)
	}
	qemu, ok := e.ctd.PodQEMU(pod.ID)
	if !ok {
		t.Fatalf("no QEMU of pod %s runs", pod.ID)
	}
	return pod, ids, netns, shim.Pid, qemu.Pid
}

// deadPod is how long after a pod's death CRI reported it.
type deadPod struct {
	containers time.Duration // the last container EXITED
	pod        time.Duration // PodSandboxStatus NOTREADY
}

// waitPodDead polls (every 50 ms) until every container of ids is EXITED
// and the pod is NOTREADY, measuring from since; it gives up after limit.
func (e *env) waitPodDead(pod *harness.Pod, ids []string, since time.Time, limit time.Duration) (deadPod, error) {
	var d deadPod
	ctx := e.ctx(limit + 10*time.Second)
	exited := map[string]bool{}
	podDone := false
	for {
		for _, id := range ids {
			if exited[id] {
				continue
			}
			if st, err := e.cri.Status(ctx, id); err == nil && st.State == runtime.ContainerState_CONTAINER_EXITED {
				exited[id] = true
				d.containers = time.Since(since)
			}
		}
		if !podDone {
			if st, err := e.cri.PodState(ctx, pod); err == nil && st == runtime.PodSandboxState_SANDBOX_NOTREADY {
				podDone = true
				d.pod = time.Since(since)
			}
		}
		if podDone && len(exited) == len(ids) {
			return d, nil
		}
		if time.Since(since) > limit {
			var states []string
			for _, id := range ids {
				st, err := e.cri.Status(ctx, id)
				states = append(states, fmt.Sprintf("%.12s: %v %v", id, st.GetState(), err))
			}
			ps, err := e.cri.PodState(ctx, pod)
			return d, fmt.Errorf("after %v: pod %v (%v), containers %s", limit, ps, err, strings.Join(states, ", "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stopAndRemove runs StopPodSandbox and RemovePodSandbox, failing the
// test when either fails.
func (e *env) stopAndRemove(pod *harness.Pod) {
	t := e.t
	t.Helper()
	ctx := e.ctx(2 * time.Minute)
	start := time.Now()
	if _, err := e.cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: pod.ID}); err != nil {
		t.Errorf("StopPodSandbox: %v", err)
	}
	if _, err := e.cri.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: pod.ID}); err != nil {
		t.Errorf("RemovePodSandbox: %v", err)
	}
	t.Logf("StopPodSandbox + RemovePodSandbox in %v", time.Since(start).Round(time.Millisecond))
}

// links lists the network interfaces of a netns (`ip -o link` in it).
func links(netns string) []string {
	out, err := exec.Command("nsenter", "--net="+netns, "ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		return nil
	}
	var names []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			// "eth0@if3:" is eth0, its peer's index after the @.
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	return names
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}
