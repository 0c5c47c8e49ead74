package faults

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// deathLimit is how soon a dead VM must be a dead pod (issue 5).
const deathLimit = 5 * time.Second

// TestShimKilled: SIGKILL the shim of a running pod. QEMU dies with it
// within 5 s, containerd sees the tasks exit (containers EXITED, the pod
// NOTREADY), StopPodSandbox and RemovePodSandbox succeed, and nothing of
// the pod is left.
func TestShimKilled(t *testing.T) {
	requireHull(t)
	e := newEnv(t)
	pod, ids, _, shim, qemu := e.podWithVM("shim-killed", harness.PodOptions{})
	killed := time.Now()
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if d, err := harness.WaitGone(qemu, 30*time.Second); err != nil {
		t.Errorf("QEMU after its shim was SIGKILLed: %v", err)
	} else if d > deathLimit {
		t.Errorf("QEMU exited %v after its shim was SIGKILLed; want within %v", d.Round(time.Millisecond), deathLimit)
	} else {
		t.Logf("QEMU gone %v after the shim's SIGKILL", d.Round(time.Millisecond))
	}
	d, err := e.waitPodDead(pod, ids, killed, 30*time.Second)
	if err != nil {
		t.Errorf("containerd does not report the pod's tasks exited: %v", err)
	} else {
		t.Logf("after the shim's SIGKILL: containers EXITED in %v, pod NOTREADY in %v",
			d.containers.Round(time.Millisecond), d.pod.Round(time.Millisecond))
	}
	e.stopAndRemove(pod)
	e.checkLeftovers("after the pod of the killed shim was removed")
}

// TestQEMUKilled: SIGKILL QEMU. Every task of the pod reports its exit
// within 5 s (containers EXITED, the pod NOTREADY), StopPodSandbox and
// RemovePodSandbox succeed, and nothing is left.
func TestQEMUKilled(t *testing.T) {
	requireHull(t)
	e := newEnv(t)
	pod, ids, _, shim, qemu := e.podWithVM("qemu-killed", harness.PodOptions{})
	killed := time.Now()
	if err := syscall.Kill(qemu, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.expectPodDeadWithin(pod, ids, killed, "QEMU's SIGKILL")
	if harness.ProcessGone(shim) {
		t.Logf("the shim exited on its own")
	}
	e.stopAndRemove(pod)
	e.checkLeftovers("after the pod whose QEMU was killed was removed")
}

func (e *env) expectPodDeadWithin(pod *harness.Pod, ids []string, since time.Time, what string) {
	t := e.t
	t.Helper()
	d, err := e.waitPodDead(pod, ids, since, 30*time.Second)
	switch {
	case err != nil:
		t.Errorf("after %s: %v", what, err)
	case d.containers > deathLimit || d.pod > deathLimit:
		t.Errorf("after %s: containers EXITED in %v, pod NOTREADY in %v; want both within %v",
			what, d.containers.Round(time.Millisecond), d.pod.Round(time.Millisecond), deathLimit)
	default:
		t.Logf("after %s: containers EXITED in %v, pod NOTREADY in %v",
			what, d.containers.Round(time.Millisecond), d.pod.Round(time.Millisecond))
	}
}

// TestGuestPanic: the guest dies under the agent — its kernel crashes
// (sysrq-trigger "c" from a privileged container; the agent is the
// guest's PID 1, which no container can see). QEMU exits (panic=1,
// -no-reboot) and every task reports its exit within 5 s of the crash;
// StopPodSandbox and RemovePodSandbox succeed; nothing is left.
func TestGuestPanic(t *testing.T) {
	requireHull(t)
	e := newEnv(t)
	priv := sleeper("priv")
	priv.Privileged = true
	pod, ids, _, _, qemu := e.podWithVM("guest-panic", harness.PodOptions{Privileged: true}, priv, sleeper("b"))
	// The exec never answers: its VM dies under it.
	crash := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		e.cri.Exec(ctx, ids[0], 15*time.Second, "sh", "-c", "echo c > /proc/sysrq-trigger")
	}()
	if d, err := harness.WaitGone(qemu, 30*time.Second); err != nil {
		t.Fatalf("the guest kernel did not die (sysrq c): %v", err)
	} else {
		t.Logf("QEMU exited %v after the crash was triggered", d.Round(time.Millisecond))
	}
	e.expectPodDeadWithin(pod, ids, crash, "the guest's crash")
	e.stopAndRemove(pod)
	e.checkLeftovers("after the pod whose guest crashed was removed")
}

// TestGuestPanicFailpoint: the same through the guest-panic failpoint
// (the shim makes the guest kernel panic 3 s after the sandbox started),
// measured from QEMU's exit.
func TestGuestPanicFailpoint(t *testing.T) {
	requireFailpoints(t)
	e := newFailpointEnv(t)
	pod, netns := e.runPod("guest-panic-fp", harness.HandlerHullFailpoints, harness.PodOptions{
		Annotations: map[string]string{harness.FailpointAnnotation: "guest-panic@4s"}})
	_ = netns
	qemu, ok := e.ctd.PodQEMU(pod.ID)
	if !ok {
		t.Fatalf("no QEMU of pod %s runs", pod.ID)
	}
	ids := []string{e.startRunning(pod, sleeper("a"))}
	if _, err := harness.WaitGone(qemu.Pid, 60*time.Second); err != nil {
		t.Fatalf("the guest-panic failpoint did not stop the VM: %v", err)
	}
	e.expectPodDeadWithin(pod, ids, time.Now(), "QEMU's exit on the guest's panic")
	e.stopAndRemove(pod)
	e.checkLeftovers("after the pod whose guest panicked was removed")
}

// TestGCAfterShimAndQEMUKilled: containerd, then a pod's shim and its QEMU
// are SIGKILLed, so that nobody cleans up. `hull gc` must remove what
// they left (state, mounts, tap devices), a second run must find nothing
// of the pod, and then containerd, started again, converges on a pod it
// can remove.
func TestGCAfterShimAndQEMUKilled(t *testing.T) {
	requireHull(t)
	e := newEnv(t)
	pod, ids, netns, shim, qemu := e.podWithVM("gc", harness.PodOptions{})
	linksBefore := links(netns)
	t.Logf("links in the pod netns while it runs: %v", linksBefore)
	// The pod's shim socket: a SIGKILLed shim cannot remove it, and with
	// containerd gone no `shim delete` will; gc must, through the state.
	address, err := os.ReadFile(filepath.Join(e.ctd.State, "io.containerd.runtime.v2.task", "k8s.io", pod.ID, "address"))
	if err != nil {
		t.Fatalf("the pod's shim address: %v", err)
	}
	socket := strings.TrimPrefix(strings.TrimSpace(string(address)), "unix://")
	if err := e.ctd.Kill(); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(shim, syscall.SIGKILL)
	syscall.Kill(qemu, syscall.SIGKILL)
	for _, pid := range []int{shim, qemu} {
		if _, err := harness.WaitGone(pid, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	all := append([]string{pod.ID}, ids...)
	left := hullResidue(e.ctd.StateDir, all)
	t.Logf("left by the killed shim and QEMU: %v", left)
	if len(left) == 0 {
		t.Fatal("the killed shim and QEMU left nothing: this test cannot show what hull gc collects")
	}
	// The state directory the killed shim left is what gc must name.
	if _, err := os.Stat(filepath.Join(e.ctd.StateDir, pod.ID)); err != nil {
		t.Fatalf("the killed shim left no state of sandbox %s for gc: %v", pod.ID, err)
	}

	hull := func(args ...string) (string, int) {
		cmd := exec.Command(hullBin, args...)
		out, err := cmd.CombinedOutput()
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}
		return string(out), code
	}
	out, code := hull("gc", "--dry-run", "--root", e.ctd.StateDir)
	t.Logf("hull gc --dry-run (exit %d):\n%s", code, out)
	out, code = hull("gc", "--root", e.ctd.StateDir)
	t.Logf("hull gc (exit %d):\n%s", code, out)
	if code != 0 {
		t.Errorf("hull gc exited %d", code)
	}
	if !strings.Contains(out, pod.ID) {
		t.Errorf("hull gc does not mention sandbox %s, whose state it should collect", pod.ID)
	}
	if rest := hullResidue(e.ctd.StateDir, all); len(rest) > 0 {
		t.Errorf("left after hull gc: %v", rest)
	}
	if _, err := os.Lstat(socket); err == nil {
		t.Errorf("the killed shim's socket %s is left after hull gc", socket)
	}
	var extra []string
	for _, l := range links(netns) {
		if !contains(linksBefore, l) || (l != "lo" && l != "eth0") {
			extra = append(extra, l)
		}
	}
	if len(extra) > 0 {
		t.Errorf("network devices left in the pod netns after hull gc (only CNI's lo and eth0 may remain): %v", extra)
	}
	out2, code2 := hull("gc", "--root", e.ctd.StateDir)
	t.Logf("second hull gc (exit %d):\n%s", code2, out2)
	if code2 != 0 || strings.Contains(out2, pod.ID) {
		t.Errorf("the second hull gc (exit %d) found the pod again:\n%s", code2, out2)
	}
	if !strings.Contains(out2, "nothing to collect") {
		t.Errorf("the second hull gc of this test's own state root %s collected something: %s", e.ctd.StateDir, out2)
	}

	// containerd's view: after its restart it finds the dead shim, and
	// the pod can be removed.
	if err := e.ctd.Start(e.ctx(2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	e.expectPodDeadWithin(pod, ids, time.Now(), "containerd's restart")
	e.stopAndRemove(pod)
	e.checkLeftovers("after hull gc and the pod's removal")
}

// hullResidue lists what of ids a dead shim may leave: mounts naming an
// id (but CRI's own, the sandbox's /dev/shm in its state directory),
// <stateDir>/<id>.
func hullResidue(stateDir string, ids []string) []string {
	var out []string
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || strings.Contains(f[4], "/io.containerd.grpc.v1.cri/") {
			continue
		}
		for _, id := range ids {
			if strings.Contains(f[4], id) {
				out = append(out, "mount "+f[4])
				break
			}
		}
	}
	for _, id := range ids {
		p := filepath.Join(stateDir, id)
		if _, err := os.Lstat(p); err == nil {
			out = append(out, "dir "+p)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
