package cri

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// Runtime handlers of the device tests: containerd lists the host's
// devices in privileged specs for both; Hull passes them only for the
// second (privileged_host_devices).
const (
	handlerHostDevsOff = "hull-hostdevs-off"
	handlerHostDevsOn  = "hull-hostdevs-on"
)

// newDeviceEnv is newEnv with the failpoint handler (when
// HULL_FAILPOINT_SHIM names the shim built with hull_failpoints) and the
// two host-device handlers.
func newDeviceEnv(t *testing.T) *env {
	t.Helper()
	e, dir := newEnvDir(t, "hull-dev-")
	e.hullConfig = filepath.Join(dir, "hull.toml")
	writeFile(t, e.hullConfig, hullConfig())
	off, on := filepath.Join(dir, "hostdevs-off.toml"), filepath.Join(dir, "hostdevs-on.toml")
	writeFile(t, off, hullConfig()+"[runtime]\nprivileged_host_devices = false\n")
	writeFile(t, on, hullConfig()+"[runtime]\nprivileged_host_devices = true\n")
	opts := harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: shimDir, HullConfig: e.hullConfig,
		FailpointShim:      os.Getenv("HULL_FAILPOINT_SHIM"),
		HostDeviceHandlers: map[string]string{handlerHostDevsOff: off, handlerHostDevsOn: on}}
	e.ctd, e.cri = harness.LaunchT(t, opts, 80, nil)
	return e
}

// loopDev is a host loop device on a file of 4 MiB starting with content.
type loopDev struct {
	file, dev    string
	major, minor int64
	detached     bool
}

func newLoop(t *testing.T, dir, content string) *loopDev {
	t.Helper()
	file := filepath.Join(dir, "disk-"+randomHex(4))
	data := make([]byte, 4<<20)
	copy(data, content)
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "-f", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	l := &loopDev{file: file, dev: strings.TrimSpace(string(out))}
	t.Cleanup(func() { l.detach() })
	b, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(l.dev), "dev"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &l.major, &l.minor)
	return l
}

func (l *loopDev) detach() {
	exec.Command("losetup", "-d", l.dev).Run()
}

// attached says whether any loop device is still attached to l's file
// (a descriptor on a detached loop device keeps it until closed).
func (l *loopDev) attached() string {
	out, _ := exec.Command("losetup", "-j", l.file).CombinedOutput()
	return strings.TrimSpace(string(out))
}

// createWith creates a container with extra CRI settings (devices,
// mounts) that harness.Container does not carry.
func createWith(ctx context.Context, cri *harness.CRI, pod *harness.Pod, name string, cmd []string, privileged bool, devs []*runtime.Device, mounts []*runtime.Mount) (string, error) {
	linux := &runtime.LinuxContainerConfig{}
	if privileged {
		linux.SecurityContext = &runtime.LinuxContainerSecurityContext{Privileged: true}
	}
	resp, err := cri.RuntimeServiceClient.CreateContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: pod.ID,
		Config: &runtime.ContainerConfig{
			Metadata:    &runtime.ContainerMetadata{Name: name},
			Image:       &runtime.ImageSpec{Image: harness.BusyboxImage},
			Command:     cmd,
			LogPath:     name + ".log",
			Linux:       linux,
			Devices:     devs,
			Mounts:      mounts,
			Annotations: pod.Config.Annotations,
		},
		SandboxConfig: pod.Config,
	})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func startC(ctx context.Context, cri *harness.CRI, id string) error {
	_, err := cri.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: id})
	return err
}

func sleeper() []string { return []string{"sleep", "100000"} }

// stopC stops container id and waits until CRI reports it exited, as
// kubelet does before it removes a container. containerd 2.x can answer
// StopContainer first: its exit handler has deleted the task and waits
// for `shim delete` (the connection's close callback) before it marks
// the container exited, and meanwhile StopContainer's SIGKILL finds the
// connection closed, then no task, and returns success; a RemoveContainer
// in that window fails with "container is still running".
//
// containerd 1.7 can fail StopContainer instead: when the container has
// exited on SIGTERM but the exit handler's task Delete (which for Hull
// removes the container from the guest and hot-unplugs its disks) takes
// longer than the stop timeout, StopContainer sends SIGKILL over the
// task's connection, which containerd closes as soon as Delete returns,
// and the kill's answer is lost: "ttrpc: closed" (seed race on 1.7, one
// pod of 20, Delete 1.03 s against the 1 s timeout). Kubelet retries a
// failed stop at the pod's next sync; so does stopC, once, after the
// container is reported exited, and that stop must succeed.
func stopC(t *testing.T, ctx context.Context, cri *harness.CRI, id string) error {
	req := &runtime.StopContainerRequest{ContainerId: id, Timeout: 1}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := cri.StopContainer(ctx, req)
	if err != nil && strings.Contains(err.Error(), "ttrpc: closed") {
		t.Logf("container %s: StopContainer failed (%v); stopping again once it has exited, as kubelet would", id, err)
		if _, werr := cri.WaitExited(wctx, id); werr != nil {
			return fmt.Errorf("StopContainer: %w; then: %w", err, werr)
		}
		_, err = cri.StopContainer(ctx, req)
	}
	if err != nil {
		return fmt.Errorf("StopContainer: %w", err)
	}
	if _, err := cri.WaitExited(wctx, id); err != nil {
		return fmt.Errorf("after StopContainer: %w", err)
	}
	return nil
}

// fdLinks lists the targets of pid's descriptors that contain s.
func fdLinks(pid int, s string) []string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return out
}

// noDeviceFDs fails unless neither the pod's shim nor its QEMU holds a
// descriptor on dev.
func (e *env) noDeviceFDs(pod *harness.Pod, dev string) {
	e.t.Helper()
	if p, ok := e.ctd.PodShim(pod.ID); ok {
		if l := fdLinks(p.Pid, dev); len(l) > 0 {
			e.t.Errorf("shim of pod %s still holds %v", pod.ID[:12], l)
		}
	}
	if p, ok := e.ctd.PodQEMU(pod.ID); ok {
		if l := fdLinks(p.Pid, dev); len(l) > 0 {
			e.t.Errorf("QEMU of pod %s still holds %v", pod.ID[:12], l)
		}
	}
}

// TestHullDevices: a host loop device read and written in the VM; a
// missing, a replaced and a detached device each fail their container
// with an error naming the device, the pod and its other containers
// unaffected; nothing held after the containers are removed.
func TestHullDevices(t *testing.T) {
	requireHull(t)
	e := newDeviceEnv(t)
	ctx := e.ctx(8 * time.Minute)
	cri := e.cri
	dir := t.TempDir()
	pod := e.runPod("devices", harness.HandlerHull)
	plain := startRunning(t, ctx, cri, pod, harness.Container{Name: "plain", Command: sleeper()})

	content := "hull-device-content-" + randomHex(4)
	l := newLoop(t, dir, content)
	devs := []*runtime.Device{{ContainerPath: "/dev/xvdz", HostPath: l.dev, Permissions: "rwm"}}
	start := time.Now()
	id, err := createWith(ctx, cri, pod, "disk", sleeper(), false, devs, nil)
	if err == nil {
		err = startC(ctx, cri, id)
	}
	if err != nil {
		t.Fatalf("container with %s: %v", l.dev, err)
	}
	t.Logf("container with a hotplugged disk started in %v", time.Since(start).Round(time.Millisecond))
	if got := execOK(t, ctx, cri, id, "head", "-c", fmt.Sprint(len(content)), "/dev/xvdz"); got != content {
		t.Errorf("read %q in the VM, want %q", got, content)
	}
	ls := execOK(t, ctx, cri, id, "ls", "-l", "/dev/xvdz")
	if !strings.HasPrefix(ls, "b") {
		t.Errorf("/dev/xvdz in the container: %s", ls)
	}
	written := "guest-wrote-" + randomHex(4)
	execOK(t, ctx, cri, id, "sh", "-c", "printf "+written+" | dd of=/dev/xvdz bs=512 seek=8 conv=notrunc,fsync 2>/dev/null")

	// Missing when the spec arrives: CRI resolved the node at
	// CreateContainer, the shim opens it at StartContainer.
	t.Run("Missing", func(t *testing.T) {
		// A device number the host does not have (no device-mapper here):
		// the seed report's /dev/dm-102.
		node := filepath.Join(dir, "dm-102")
		if out, err := exec.Command("mknod", node, "b", "253", "102").CombinedOutput(); err != nil {
			t.Fatalf("mknod: %v %s", err, out)
		}
		id, err := createWith(ctx, cri, pod, "missing", sleeper(), false, []*runtime.Device{{ContainerPath: "/dev/dm-102", HostPath: node, Permissions: "rwm"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = startC(ctx, cri, id)
		want := "host device /dev/dm-102 (253:102): no such file"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("start: %v, want an error containing %q", err, want)
		}
		cri.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id})
	})
	t.Run("Detached", func(t *testing.T) {
		d := newLoop(t, dir, "detached")
		id, err := createWith(ctx, cri, pod, "detached", sleeper(), false, []*runtime.Device{{ContainerPath: "/dev/xvdy", HostPath: d.dev, Permissions: "rwm"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		d.detach()
		err = startC(ctx, cri, id)
		if err == nil || !strings.Contains(err.Error(), "host device "+d.dev) || !strings.Contains(err.Error(), "size 0") {
			t.Errorf("start: %v, want an error naming %s and size 0", err, d.dev)
		}
		cri.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id})
		e.noDeviceFDs(pod, d.dev)
	})
	assertPodHealthy(t, ctx, cri, pod, plain, id)

	// Removing the container unplugs the disk (DEVICE_DELETED) and closes
	// every descriptor.
	if err := stopC(t, ctx, cri, id); err != nil {
		t.Fatal(err)
	}
	if _, err := cri.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id}); err != nil {
		t.Fatal(err)
	}
	e.noDeviceFDs(pod, l.dev)
	if out := execOK(t, ctx, cri, plain, "sh", "-c", "ls /sys/block | grep -v -e ^ram -e ^loop || true"); out != "" {
		t.Errorf("guest disks after the container was removed: %q", out)
	}
	assertPodHealthy(t, ctx, cri, pod, plain)

	// What the guest wrote is in the host file.
	l.detach()
	b, err := os.ReadFile(l.file)
	if err != nil {
		t.Fatal(err)
	}
	if got := b[4096 : 4096+len(written)]; !bytes.Equal(got, []byte(written)) {
		t.Errorf("host file at 4096: %q, want %q", got, written)
	}
}

// runPodWith is runPod with options (a handler, annotations, privilege).
func (e *env) runPodWith(name, handler string, o harness.PodOptions) *harness.Pod {
	t := e.t
	t.Helper()
	logDir := filepath.Join(e.logRoot, name)
	os.MkdirAll(logDir, 0o755)
	pod, err := e.cri.RunPodWith(e.ctx(5*time.Minute), name, handler, logDir, o)
	if err != nil {
		t.Fatalf("RunPodSandbox %s (handler %s): %v", name, handler, err)
	}
	netns, _ := e.cri.PodNetns(e.ctx(time.Minute), pod.ID)
	t.Cleanup(func() {
		ids, _ := e.cri.PodContainers(context.Background(), pod.ID)
		ids = append(ids, pod.ID)
		if err := e.cri.RemovePod(e.ctx(2*time.Minute), pod.ID); err != nil {
			t.Errorf("removing pod %s at cleanup: %v", name, err)
		}
		e.checkNoResidue(ids, netns)
	})
	return pod
}

// seedPods is how many pods the seed race starts at once: the seed
// report's 20, or HULL_SEED_PODS.
func seedPodCount(t *testing.T) int {
	n := 20
	if v := os.Getenv("HULL_SEED_PODS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("HULL_SEED_PODS=%q: want a positive number", v)
		}
	}
	return n
}

// TestHullDeviceSeedRace is the seed report: pods started together, each
// given a host loop device, while the devices' nodes are deleted or the
// loop devices detached at random moments between CreateContainer and
// the hotplug (widened by the device-delay failpoint). Each container
// either runs with its device's content or fails naming the device;
// every pod's plain container runs throughout; nothing is held or left.
func TestHullDeviceSeedRace(t *testing.T) {
	requireHull(t)
	if os.Getenv("HULL_FAILPOINT_SHIM") == "" {
		t.Skip("needs HULL_FAILPOINT_SHIM (make shim-failpoints; make test sets it)")
	}
	seedPods := seedPodCount(t)
	e := newDeviceEnv(t)
	ctx := e.ctx(12 * time.Minute)
	cri := e.cri
	dir := t.TempDir()
	begin := time.Now()

	pods := make([]*harness.Pod, seedPods)
	loops := make([]*loopDev, seedPods)
	plains := make([]string, seedPods)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i := range seedPods {
		loops[i] = newLoop(t, dir, fmt.Sprintf("seed-content-%02d", i))
	}
	// Nodes removed by the race come back at the end.
	t.Cleanup(func() {
		for _, l := range loops {
			if _, err := os.Stat(l.dev); os.IsNotExist(err) {
				exec.Command("mknod", "-m", "0660", l.dev, "b", fmt.Sprint(l.major), fmt.Sprint(l.minor)).Run()
				exec.Command("chgrp", "disk", l.dev).Run()
			}
		}
	})
	for i := range seedPods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			delay := fmt.Sprintf("device-delay@%dms", 50+rand.IntN(250))
			p := e.runPodWith(fmt.Sprintf("seed-%02d", i), harness.HandlerHullFailpoints,
				harness.PodOptions{Annotations: map[string]string{harness.FailpointAnnotation: delay}})
			mu.Lock()
			pods[i] = p
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.Logf("%d pods ready in %v", seedPods, time.Since(begin).Round(time.Millisecond))
	for i, p := range pods {
		if p == nil {
			t.Fatalf("pod %d did not start", i)
		}
		plains[i] = startRunning(t, ctx, cri, p, harness.Container{Name: "plain", Command: sleeper()})
	}

	var ran, failed int
	for i := range seedPods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, pod := loops[i], pods[i]
			id, err := createWith(ctx, cri, pod, "disk", sleeper(), false,
				[]*runtime.Device{{ContainerPath: "/dev/xvdz", HostPath: l.dev, Permissions: "rwm"}}, nil)
			if err != nil {
				t.Errorf("pod %d: CreateContainer: %v", i, err)
				return
			}
			// The race: at a random moment, detach the loop device or
			// delete its node.
			chaos := make(chan string, 1)
			go func() {
				time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
				if rand.IntN(2) == 0 {
					l.detach()
					chaos <- "detached"
				} else {
					os.Remove(l.dev)
					chaos <- "node removed"
				}
			}()
			err = startC(ctx, cri, id)
			what := <-chaos
			if err != nil {
				if !strings.Contains(err.Error(), "host device /dev/"+filepath.Base(l.dev)) {
					t.Errorf("pod %d (%s): start failed without naming %s: %v", i, what, l.dev, err)
				}
				mu.Lock()
				failed++
				mu.Unlock()
				cri.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id})
				e.noDeviceFDs(pod, filepath.Base(l.dev))
				return
			}
			want := fmt.Sprintf("seed-content-%02d", i)
			out, _, code, err := cri.Exec(ctx, id, time.Minute, "head", "-c", fmt.Sprint(len(want)), "/dev/xvdz")
			if err != nil || code != 0 || out != want {
				t.Errorf("pod %d (%s): running, but read %q (exit %d, %v), want %q", i, what, out, code, err, want)
			}
			mu.Lock()
			ran++
			mu.Unlock()
			if err := stopC(t, ctx, cri, id); err != nil {
				t.Errorf("pod %d: %v\ncontainerd's log of the container:\n%s", i, err, e.ctd.LogLines(id))
			}
			if _, err := cri.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id}); err != nil {
				t.Errorf("pod %d: RemoveContainer: %v\ncontainerd's log of the container:\n%s", i, err, e.ctd.LogLines(id))
			}
			e.noDeviceFDs(pod, filepath.Base(l.dev))
		}()
	}
	wg.Wait()
	t.Logf("seed race: %d containers ran with their device, %d failed naming it", ran, failed)
	for i, p := range pods {
		assertPodHealthy(t, ctx, cri, p, plains[i])
	}
	for _, p := range pods {
		if err := cri.RemovePod(ctx, p.ID); err != nil {
			t.Errorf("RemovePodSandbox: %v", err)
		}
	}
	// No descriptor on any loop device survives: once detached (by the
	// race or now), a loop device held by nobody is gone.
	for _, l := range loops {
		l.detach()
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, l := range loops {
		for l.attached() != "" && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if a := l.attached(); a != "" {
			t.Errorf("loop device still attached after every pod was removed: %s", a)
		}
	}
	t.Logf("seed race total %v", time.Since(begin).Round(time.Millisecond))
}

// TestHullPrivilegedAndVolumes: a privileged container with
// privileged_host_devices = false sees none of the host's devices (and
// has a writable /sys), with true it sees them; a hostPath directory rw
// and a file ro; an emptyDir shared by two containers.
func TestHullPrivilegedAndVolumes(t *testing.T) {
	requireHull(t)
	e := newDeviceEnv(t)
	ctx := e.ctx(8 * time.Minute)
	cri := e.cri
	dir := t.TempDir()
	content := "privileged-" + randomHex(4)
	l := newLoop(t, dir, content)
	devName := "/dev/" + filepath.Base(l.dev)

	for _, tc := range []struct {
		handler string
		sees    bool
	}{{handlerHostDevsOff, false}, {handlerHostDevsOn, true}} {
		t.Run(tc.handler, func(t *testing.T) {
			pod := e.runPodWith("priv-"+tc.handler, tc.handler, harness.PodOptions{Privileged: true})
			id, err := createWith(ctx, cri, pod, "priv", sleeper(), true, nil, nil)
			if err == nil {
				err = startC(ctx, cri, id)
			}
			if err != nil {
				t.Fatalf("privileged container: %v", err)
			}
			if out := execOK(t, ctx, cri, id, "sh", "-c", "grep ' /sys ' /proc/mounts"); !strings.Contains(out, " rw") {
				t.Errorf("privileged /sys not writable: %s", out)
			}
			out, _, code, _ := cri.Exec(ctx, id, time.Minute, "head", "-c", fmt.Sprint(len(content)), devName)
			if tc.sees && (code != 0 || out != content) {
				t.Errorf("%s in the container: %q (exit %d), want %q", devName, out, code, content)
			}
			if !tc.sees {
				if code == 0 {
					t.Errorf("%s readable with privileged_host_devices = false", devName)
				}
				if ls := execOK(t, ctx, cri, id, "sh", "-c", "ls /dev | grep -e ^loop -e ^vd -e ^zram || true"); ls != "" {
					t.Errorf("host devices in /dev with privileged_host_devices = false: %q", ls)
				}
			}
		})
	}

	t.Run("Volumes", func(t *testing.T) {
		pod := e.runPod("volumes", harness.HandlerHull)
		rw := filepath.Join(dir, "rw")
		empty := filepath.Join(dir, "emptydir")
		roFile := filepath.Join(dir, "config")
		os.MkdirAll(rw, 0o755)
		os.MkdirAll(empty, 0o777)
		writeFile(t, roFile, "read-only-config\n")
		mounts := []*runtime.Mount{
			{ContainerPath: "/data", HostPath: rw},
			{ContainerPath: "/etc/app.conf", HostPath: roFile, Readonly: true},
			{ContainerPath: "/shared", HostPath: empty},
		}
		a, err := createWith(ctx, cri, pod, "a", sleeper(), false, nil, mounts)
		if err == nil {
			err = startC(ctx, cri, a)
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := createWith(ctx, cri, pod, "b", sleeper(), false, nil, mounts[2:])
		if err == nil {
			err = startC(ctx, cri, b)
		}
		if err != nil {
			t.Fatal(err)
		}
		execOK(t, ctx, cri, a, "sh", "-c", "echo from-guest > /data/out")
		if got, _ := os.ReadFile(filepath.Join(rw, "out")); string(got) != "from-guest\n" {
			t.Errorf("hostPath rw: host file %q", got)
		}
		if got := execOK(t, ctx, cri, a, "cat", "/etc/app.conf"); got != "read-only-config" {
			t.Errorf("ro file reads %q", got)
		}
		if _, _, code, _ := cri.Exec(ctx, a, time.Minute, "sh", "-c", "echo x > /etc/app.conf"); code == 0 {
			t.Error("write to a read-only file mount succeeded")
		}
		if got, _ := os.ReadFile(roFile); string(got) != "read-only-config\n" {
			t.Errorf("ro file changed on the host: %q", got)
		}
		execOK(t, ctx, cri, a, "sh", "-c", "echo hello-b > /shared/msg")
		if got := execOK(t, ctx, cri, b, "cat", "/shared/msg"); got != "hello-b" {
			t.Errorf("emptyDir: b reads %q", got)
		}
	})
}
