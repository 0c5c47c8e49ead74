package cri

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/template"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// A container that runs until it is killed (without trapping SIGTERM:
// StopPodSandbox kills with SIGKILL).
func forever(name string) []string {
	return []string{"sh", "-c", "echo hello-from-" + name + "; echo err-from-" + name + " >&2; exec sleep 2147483647"}
}

// TestRuncPod proves the harness (and the scenario the hull test runs)
// with containerd's own runc runtime.
func TestRuncPod(t *testing.T) {
	requireBase(t)
	podScenario(t, newEnv(t), harness.HandlerRunc)
}

// TestHullPod is issue 3's CRI list on one pod (one VM boot): two
// containers share the VM but not a filesystem, logs, ExecSync, exec with
// a tty, a container exiting on its own while the pod stays up and a new
// one starting after it, ContainerStats, an image whose entrypoint does
// not exist, StopPodSandbox, RemovePodSandbox, and nothing left after.
func TestHullPod(t *testing.T) {
	requireHull(t)
	podScenario(t, newEnv(t), harness.HandlerHull)
}

// TestHullPodCold is the pod scenario with VM templates off: every VM
// booted (the other hull tests restore theirs from a template, the
// default).
func TestHullPodCold(t *testing.T) {
	requireHull(t)
	podScenario(t, newEnv(t), handlerCold)
}

func podScenario(t *testing.T, e *env, handler string) {
	ctx := e.ctx(10 * time.Minute)
	cri := e.cri
	pod := e.runPod("pod-"+handler, handler)
	netns, err := cri.PodNetns(ctx, pod.ID)
	if err != nil {
		t.Errorf("pod netns: %v", err)
	}
	if st, err := cri.PodState(ctx, pod); err != nil || st != runtime.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod state after RunPodSandbox = %v, %v; want SANDBOX_READY", st, err)
	}

	a := harness.Container{Name: "a", Command: forever("a")}
	b := harness.Container{Name: "b", Command: forever("b")}
	idA := startRunning(t, ctx, cri, pod, a)
	idB := startRunning(t, ctx, cri, pod, b)

	t.Run("OneVMTwoFilesystems", func(t *testing.T) {
		bootA := execOK(t, ctx, cri, idA, "cat", "/proc/sys/kernel/random/boot_id")
		bootB := execOK(t, ctx, cri, idB, "cat", "/proc/sys/kernel/random/boot_id")
		if bootA == "" || bootA != bootB {
			t.Errorf("boot ids differ: a %q, b %q; want one VM", bootA, bootB)
		}
		if handler != harness.HandlerRunc {
			host, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
			if strings.TrimSpace(string(host)) == bootA {
				t.Errorf("the containers share the host's boot id %s: not in a VM", bootA)
			}
		}
		execOK(t, ctx, cri, idA, "sh", "-c", "echo a > /only-in-a")
		if got := execOK(t, ctx, cri, idA, "cat", "/only-in-a"); got != "a" {
			t.Errorf("a reads back %q, want \"a\"", got)
		}
		if _, _, code, err := cri.Exec(ctx, idB, 30*time.Second, "test", "-e", "/only-in-a"); err != nil || code != 1 {
			t.Errorf("in b, test -e /only-in-a = exit %d, %v; want 1 (the file is a's)", code, err)
		}
	})

	t.Run("Logs", func(t *testing.T) {
		waitLog(t, harness.LogFile(pod, a), "stdout", "hello-from-a")
		waitLog(t, harness.LogFile(pod, a), "stderr", "err-from-a")
		waitLog(t, harness.LogFile(pod, b), "stdout", "hello-from-b")
	})

	t.Run("ExecSync", func(t *testing.T) {
		out, errOut, code, err := cri.Exec(ctx, idA, 30*time.Second, "sh", "-c", "echo out; echo err >&2; exit 7")
		if err != nil {
			t.Fatal(err)
		}
		if out != "out\n" || errOut != "err\n" || code != 7 {
			t.Errorf("ExecSync = stdout %q, stderr %q, exit %d; want \"out\\n\", \"err\\n\", 7", out, errOut, code)
		}
	})

	t.Run("ExecTTY", func(t *testing.T) {
		ectx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		res, err := cri.ExecStream(ectx, idA, true,
			"test -t 0 && test -t 1 && echo TTY-$((6*7)); stty size; exit 5\n", "sh")
		if err != nil {
			t.Fatalf("exec with a tty: %v", err)
		}
		if !strings.Contains(res.Output, "TTY-42\r\n") {
			t.Errorf("tty output %q lacks \"TTY-42\\r\\n\" (stdin and stdout a terminal, CRLF line ends)", res.Output)
		}
		if !strings.Contains(res.Output, "40 100") {
			t.Errorf("tty output %q lacks the size sent by the client (\"40 100\")", res.Output)
		}
		if res.ExitCode != 5 {
			t.Errorf("tty exec exit code = %d, want 5", res.ExitCode)
		}
		// The same without a tty: separate stdout and stderr.
		res, err = cri.ExecStream(ectx, idA, false, "", "sh", "-c", "echo plain; echo e >&2")
		if err != nil {
			t.Fatalf("exec without a tty: %v", err)
		}
		if res.Output != "plain\n" || res.Stderr != "e\n" || res.ExitCode != 0 {
			t.Errorf("exec without tty = %+v; want stdout \"plain\\n\", stderr \"e\\n\", exit 0", res)
		}
	})

	t.Run("ExitOnItsOwnThenNewContainer", func(t *testing.T) {
		c := harness.Container{Name: "c", Command: []string{"sh", "-c", "echo bye; exit 3"}}
		idC, err := cri.StartNew(ctx, pod, c)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		st, err := cri.WaitExited(wctx, idC)
		if err != nil {
			t.Fatal(err)
		}
		if st.ExitCode != 3 {
			t.Errorf("exit code in ContainerStatus = %d, want 3 (reason %q, message %q)", st.ExitCode, st.Reason, st.Message)
		}
		if st.FinishedAt == 0 {
			t.Errorf("ContainerStatus has no FinishedAt")
		}
		waitLog(t, harness.LogFile(pod, c), "stdout", "bye")
		assertPodHealthy(t, ctx, cri, pod, idA, idB)
		d := harness.Container{Name: "d", Command: forever("d")}
		idD := startRunning(t, ctx, cri, pod, d)
		waitLog(t, harness.LogFile(pod, d), "stdout", "hello-from-d")
		bootA := execOK(t, ctx, cri, idA, "cat", "/proc/sys/kernel/random/boot_id")
		if bootD := execOK(t, ctx, cri, idD, "cat", "/proc/sys/kernel/random/boot_id"); bootD != bootA {
			t.Errorf("the new container's boot id %q differs from a's %q", bootD, bootA)
		}
	})

	t.Run("ContainerStats", func(t *testing.T) {
		// Some work to count.
		execOK(t, ctx, cri, idA, "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo $i")
		resp, err := cri.ContainerStats(ctx, &runtime.ContainerStatsRequest{ContainerId: idA})
		if err != nil {
			t.Fatalf("ContainerStats: %v", err)
		}
		s := resp.Stats
		if s.GetCpu().GetUsageCoreNanoSeconds().GetValue() == 0 {
			t.Errorf("CPU usage is zero: %v", s.GetCpu())
		}
		if s.GetMemory().GetWorkingSetBytes().GetValue() == 0 && s.GetMemory().GetUsageBytes().GetValue() == 0 {
			t.Errorf("memory usage is zero: %v", s.GetMemory())
		}
		t.Logf("stats of a: cpu %d ns, memory working set %d B",
			s.GetCpu().GetUsageCoreNanoSeconds().GetValue(), s.GetMemory().GetWorkingSetBytes().GetValue())
	})

	t.Run("MissingEntrypoint", func(t *testing.T) {
		bad := harness.Container{Name: "bad", Image: harness.NoEntrypointImage}
		id, err := cri.StartNew(ctx, pod, bad)
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if id != "" {
			wctx, cancel := context.WithTimeout(ctx, time.Minute)
			st, werr := cri.WaitExited(wctx, id)
			cancel()
			if werr == nil || st != nil {
				if st.State != runtime.ContainerState_CONTAINER_EXITED && st.State != runtime.ContainerState_CONTAINER_CREATED {
					t.Errorf("container with a missing entrypoint is %s", st.State)
				}
				msg += " " + st.Reason + " " + st.Message
			}
		}
		if err == nil && !strings.Contains(msg, harness.MissingEntrypoint) {
			t.Errorf("the container with a missing entrypoint started without an error")
		}
		if !strings.Contains(msg, harness.MissingEntrypoint) {
			t.Errorf("the error does not name %s: %q", harness.MissingEntrypoint, msg)
		}
		t.Logf("error for the missing entrypoint: %s", msg)
		assertPodHealthy(t, ctx, cri, pod, idA, idB)
	})

	// StopPodSandbox, then RemovePodSandbox, and nothing of the pod left.
	ids, err := cri.PodContainers(ctx, pod.ID)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, pod.ID)
	if _, err := cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: pod.ID}); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if st, err := cri.PodState(ctx, pod); err != nil || st != runtime.PodSandboxState_SANDBOX_NOTREADY {
		t.Errorf("pod state after StopPodSandbox = %v, %v; want SANDBOX_NOTREADY", st, err)
	}
	for _, id := range []string{idA, idB} {
		if st, err := cri.Status(ctx, id); err != nil || st.State != runtime.ContainerState_CONTAINER_EXITED {
			t.Errorf("container %s after StopPodSandbox: %v, %v; want CONTAINER_EXITED", id, st.GetState(), err)
		}
	}
	if _, err := cri.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: pod.ID}); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	if _, err := cri.PodSandboxStatus(ctx, &runtime.PodSandboxStatusRequest{PodSandboxId: pod.ID}); err == nil {
		t.Errorf("PodSandboxStatus still finds the removed pod")
	}
	e.checkNoResidue(ids, netns)
	if handler != harness.HandlerRunc {
		if p := e.ctd.ShimProcesses(shimName); len(p) != 0 {
			t.Errorf("hull shims still running after the only pod was removed: %v", p)
		}
		if p := e.ctd.QEMUProcesses(ids...); len(p) != 0 {
			t.Errorf("QEMU still running after the pod was removed: %v", p)
		}
	}
}

// TestRuncContainerdRestart proves the harness's restart with runc.
func TestRuncContainerdRestart(t *testing.T) {
	requireBase(t)
	restartScenario(t, newEnv(t), harness.HandlerRunc)
}

// TestHullContainerdRestart: containerd restarted while a pod runs; the
// pod (its shim and its QEMU) keeps running, containerd reconnects (exec,
// status, logs), and the later teardown works and leaves nothing.
func TestHullContainerdRestart(t *testing.T) {
	requireHull(t)
	restartScenario(t, newEnv(t), harness.HandlerHull)
}

func restartScenario(t *testing.T, e *env, handler string) {
	ctx := e.ctx(10 * time.Minute)
	pod := e.runPod("restart-"+handler, handler)
	ticker := harness.Container{Name: "ticker", Command: []string{"sh", "-c",
		"i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.5; done"}}
	id := startRunning(t, ctx, e.cri, pod, ticker)
	waitLog(t, harness.LogFile(pod, ticker), "stdout", "tick-1")
	boot := execOK(t, ctx, e.cri, id, "cat", "/proc/sys/kernel/random/boot_id")
	shimsBefore := e.ctd.ShimProcesses("containerd-shim")
	qemuBefore := e.ctd.QEMUProcesses(pod.ID)
	if len(shimsBefore) == 0 {
		t.Fatalf("no shim serves this containerd")
	}
	if handler == harness.HandlerHull && len(qemuBefore) != 1 {
		t.Errorf("QEMU processes of the pod before the restart: %v; want one", qemuBefore)
	}

	if err := e.ctd.Restart(ctx); err != nil {
		t.Fatalf("restarting containerd: %v", err)
	}
	restarted := time.Now()
	for _, p := range append(shimsBefore, qemuBefore...) {
		if !alive(p.Pid) {
			t.Errorf("process %d did not survive containerd's restart: %s", p.Pid, p.Cmdline)
		}
	}
	if st, err := e.cri.PodState(ctx, pod); err != nil || st != runtime.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod state after the restart = %v, %v; want SANDBOX_READY", st, err)
	}
	if st, err := e.cri.Status(ctx, id); err != nil || st.State != runtime.ContainerState_CONTAINER_RUNNING {
		t.Errorf("container after the restart = %v, %v; want CONTAINER_RUNNING", st.GetState(), err)
	}
	if got := execOK(t, ctx, e.cri, id, "cat", "/proc/sys/kernel/random/boot_id"); got != boot {
		t.Errorf("boot id after the restart %q, before %q: the VM was replaced", got, boot)
	}
	// Output keeps reaching the log after the restart.
	waitLogAfter(t, harness.LogFile(pod, ticker), restarted)
	// A new container can join the pod through the new containerd.
	startRunning(t, ctx, e.cri, pod, harness.Container{Name: "late", Command: forever("late")})
	waitLog(t, harness.LogFile(pod, harness.Container{Name: "late"}), "stdout", "hello-from-late")
	// The runPod cleanup removes the pod and checks that nothing remains.
}

// TestRuncCtrRun proves the harness's ctr path with runc.
func TestRuncCtrRun(t *testing.T) {
	requireBase(t)
	ctrRunScenario(t, newEnv(t), "io.containerd.runc.v2")
}

// TestHullCtrRun: `ctr run --runtime io.containerd.hull.v2` with the
// imported busybox image prints the command's output and exits with its
// exit code, and leaves nothing.
func TestHullCtrRun(t *testing.T) {
	requireHull(t)
	ctrRunScenario(t, newEnv(t), harness.HullRuntimeType)
}

func ctrRunScenario(t *testing.T, e *env, runtimeType string) {
	ctx := e.ctx(5 * time.Minute)
	id := "ctr-" + randomHex(4)
	args := []string{"--namespace", "default", "run", "--rm", "--runtime", runtimeType,
		"--fifo-dir", t.TempDir()}
	if runtimeType == harness.HullRuntimeType {
		args = append(args, "--runtime-config-path", e.ctd.HullConfig())
	}
	args = append(args, harness.BusyboxImage, id, "sh", "-c", "echo hello-from-ctr; cat /proc/sys/kernel/random/boot_id; exit 3")
	out, err := e.ctd.Ctr(ctx, args...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("ctr run: %v, want exit status 3; output:\n%s", err, out)
	}
	if !strings.Contains(out, "hello-from-ctr") {
		t.Errorf("ctr run output %q lacks hello-from-ctr", out)
	}
	if runtimeType == harness.HullRuntimeType {
		host, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if strings.Contains(out, strings.TrimSpace(string(host))) {
			t.Errorf("the container printed the host's boot id: not in a VM")
		}
	}
	e.checkNoResidue([]string{id})
	if p := e.ctd.ShimProcesses("containerd-shim"); len(p) != 0 {
		t.Errorf("shims still running after ctr run --rm: %v", p)
	}
	if runtimeType == harness.HullRuntimeType {
		// The pod's VM came from a template in the test's own state root.
		if ents, _ := os.ReadDir(filepath.Join(e.ctd.StateDir, template.DirName)); len(ents) == 0 {
			t.Errorf("no VM template in the test's state root %s after ctr run", e.ctd.StateDir)
		}
	}
}

// TestHullBrokenConfig: a ConfigPath whose file holds an invalid value
// makes RunPodSandbox fail with an error naming the key, and leaves
// nothing behind.
func TestHullBrokenConfig(t *testing.T) {
	requireHull(t)
	e := newEnv(t)
	ctx := e.ctx(3 * time.Minute)
	before := stateEntries(e.ctd.StateDir)
	_, err := e.cri.RunPod(ctx, "broken", harness.HandlerHullBroken, t.TempDir())
	if err == nil {
		t.Fatalf("RunPodSandbox with a config setting %s = %s succeeded", brokenConfigKey, brokenConfigValue)
	}
	if !strings.Contains(err.Error(), e.brokenKey) {
		t.Errorf("RunPodSandbox's error does not name %s: %v", e.brokenKey, err)
	}
	t.Logf("RunPodSandbox error: %v", err)
	pods, err := e.cri.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range pods.Items {
		ids = append(ids, p.Id)
		t.Errorf("pod %s (%s) left after the failed RunPodSandbox", p.Id, p.State)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(e.ctd.ShimProcesses(shimName)) != 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if p := e.ctd.ShimProcesses(shimName); len(p) != 0 {
		t.Errorf("hull shim still running after the failed RunPodSandbox: %v", p)
	}
	if p := e.ctd.QEMUProcesses(ids...); len(p) != 0 {
		t.Errorf("QEMU running after the failed RunPodSandbox: %v", p)
	}
	for _, n := range stateEntries(e.ctd.StateDir) {
		if !contains(before, n) {
			t.Errorf("left in %s after the failed RunPodSandbox: %s", e.ctd.StateDir, n)
		}
	}
}

// stateEntries lists what is in the test containerd's own Hull state
// root (the harness gives each its own).
func stateEntries(root string) []string {
	ents, _ := os.ReadDir(root)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
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

// startRunning creates and starts ct in pod and waits until it runs.
func startRunning(t *testing.T, ctx context.Context, cri *harness.CRI, pod *harness.Pod, ct harness.Container) string {
	t.Helper()
	start := time.Now()
	id, err := cri.StartNew(ctx, pod, ct)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := cri.WaitState(wctx, id, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
		t.Fatal(err)
	}
	t.Logf("container %s running after %v", ct.Name, time.Since(start).Round(time.Millisecond))
	return id
}

// execOK runs cmd with ExecSync, fails the test unless it exits 0, and
// returns its stdout without surrounding white space.
func execOK(t *testing.T, ctx context.Context, cri *harness.CRI, id string, cmd ...string) string {
	t.Helper()
	out, errOut, code, err := cri.Exec(ctx, id, time.Minute, cmd...)
	if err != nil || code != 0 {
		t.Fatalf("ExecSync %q: exit %d, %v; stderr %q", cmd, code, err, errOut)
	}
	return strings.TrimSpace(out)
}

// assertPodHealthy checks that the pod is ready and its running
// containers still run and answer an exec.
func assertPodHealthy(t *testing.T, ctx context.Context, cri *harness.CRI, pod *harness.Pod, ids ...string) {
	t.Helper()
	if st, err := cri.PodState(ctx, pod); err != nil || st != runtime.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod state = %v, %v; want SANDBOX_READY", st, err)
	}
	for _, id := range ids {
		if st, err := cri.Status(ctx, id); err != nil || st.State != runtime.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s = %v, %v; want CONTAINER_RUNNING", id, st.GetState(), err)
			continue
		}
		execOK(t, ctx, cri, id, "true")
	}
}

// waitLog waits (30 s at most) until the CRI log file has a line of stream
// containing want.
func waitLog(t *testing.T, file, stream, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		text, err := harness.LogText(file, stream)
		if err == nil && strings.Contains(text, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("CRI log %s (%s): no %q within 30 s (err %v); it holds:\n%s", file, stream, want, err, text)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitLogAfter waits (30 s at most) for a log line written after since.
func waitLogAfter(t *testing.T, file string, since time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		lines, err := harness.ReadLog(file)
		if err == nil && len(lines) > 0 && lines[len(lines)-1].Time.After(since) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("CRI log %s: no line written after %v within 30 s (err %v)", file, since, err)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func alive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestResidueCheckSeesARunningPod keeps the residue check honest: while a
// runc pod runs, it must report the pod's shim process, mounts, shim
// socket and directories.
func TestResidueCheckSeesARunningPod(t *testing.T) {
	requireBase(t)
	e := newEnv(t)
	pod := e.runPod("residue", harness.HandlerRunc)
	var got []string
	for _, err := range e.ctd.Residue(time.Millisecond, []string{pod.ID}) {
		got = append(got, err.Error())
	}
	all := strings.Join(got, "\n")
	for _, want := range []string{"process", "mount still present", "shim socket", "left in containerd's directory"} {
		if !strings.Contains(all, want) {
			t.Errorf("residue of a running pod lacks %q; got:\n%s", want, all)
		}
	}
}
