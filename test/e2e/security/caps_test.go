package security

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// Probes of the process's privileges, run by ExecSync (the exec process
// gets the container's capabilities, no_new_privs and seccomp filter) and
// read from /proc/1 (the container's init).
const (
	capsProbe = `grep ^Cap /proc/self/status; grep ^Cap /proc/1/status`
	nnpProbe  = `grep NoNewPrivs /proc/self/status /proc/1/status`
	// setuidProbe: as nobody, a setuid-root copy of busybox runs ping,
	// which needs a raw socket (euid 0 with CAP_NET_RAW): under
	// no_new_privs the copy does not become root and ping is refused.
	// (busybox drops a setuid root for most applets, not for ping.)
	// The copy keeps the name busybox, which it reads its applet from.
	// The copy is the image's (/suid/busybox, mode 4755): a container
	// cannot make a setuid file on Hull's share (docs/security.md).
	setuidProbe = `su -s /bin/sh -c '/suid/busybox ping -c 1 -W 5 127.0.0.1 >/dev/null 2>&1; echo suid-ping=$?; id -u' nobody`
	// seccompProbe: unshare of a user namespace needs no capability, the
	// RuntimeDefault profile refuses it (EPERM).
	seccompProbe = `grep ^Seccomp: /proc/self/status /proc/1/status; unshare -U true 2>&1; echo unshare=$?`
)

// procSecurityProbes runs the probes in a pod of handler and returns the
// outputs by name.
func procSecurityProbes(t *testing.T, e *env, handler string) map[string]string {
	pod := e.runPod("proc-"+handler, handler, podOptions{pid: runtime.NamespaceMode_CONTAINER, privileged: true})
	runtimeDefault := &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_RuntimeDefault}
	unconfined := &runtime.SecurityProfile{ProfileType: runtime.SecurityProfile_Unconfined}
	probes := []struct {
		name   string
		sc     *runtime.LinuxContainerSecurityContext
		script string
	}{
		{"caps default", &runtime.LinuxContainerSecurityContext{}, capsProbe},
		{"caps drop ALL", &runtime.LinuxContainerSecurityContext{Capabilities: &runtime.Capability{DropCapabilities: []string{"ALL"}}}, capsProbe},
		{"caps add NET_ADMIN", &runtime.LinuxContainerSecurityContext{Capabilities: &runtime.Capability{AddCapabilities: []string{"NET_ADMIN"}}}, capsProbe},
		{"caps privileged", &runtime.LinuxContainerSecurityContext{Privileged: true}, capsProbe + "\n" + seccompProbe},
		{"nnp on", &runtime.LinuxContainerSecurityContext{NoNewPrivs: true}, nnpProbe + "\n" + setuidProbe},
		{"nnp off", &runtime.LinuxContainerSecurityContext{}, nnpProbe + "\n" + setuidProbe},
		{"seccomp RuntimeDefault", &runtime.LinuxContainerSecurityContext{Seccomp: runtimeDefault}, seccompProbe},
		{"seccomp RuntimeDefault nnp", &runtime.LinuxContainerSecurityContext{Seccomp: runtimeDefault, NoNewPrivs: true}, seccompProbe},
		{"seccomp Unconfined", &runtime.LinuxContainerSecurityContext{Seccomp: unconfined}, seccompProbe},
	}
	res := map[string]string{}
	for i, p := range probes {
		// Its own PID namespace, so that /proc/1 is its init.
		p.sc.NamespaceOptions = &runtime.NamespaceOption{
			Network: runtime.NamespaceMode_POD, Pid: runtime.NamespaceMode_CONTAINER, Ipc: runtime.NamespaceMode_POD,
		}
		id := e.startSecure(pod, "p"+string(rune('a'+i)), p.sc)
		res[p.name] = e.sh(id, p.script)
	}
	return res
}

// startSecure creates and starts busybox sleeping with the security
// context sc and waits until it runs.
func (e *env) startSecure(pod *harness.Pod, name string, sc *runtime.LinuxContainerSecurityContext) string {
	t := e.t
	t.Helper()
	ctx := e.ctx(3 * time.Minute)
	resp, err := e.cri.RuntimeServiceClient.CreateContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: pod.ID,
		Config: &runtime.ContainerConfig{
			Metadata: &runtime.ContainerMetadata{Name: name},
			Image:    &runtime.ImageSpec{Image: suidImage},
			Command:  []string{"sleep", "2147483647"},
			LogPath:  name + ".log",
			Linux:    &runtime.LinuxContainerConfig{SecurityContext: sc},
		},
		SandboxConfig: pod.Config,
	})
	if err != nil {
		t.Fatalf("creating container %s: %v", name, err)
	}
	id := resp.ContainerId
	if _, err := e.cri.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("starting container %s: %v", name, err)
	}
	if _, err := e.cri.WaitState(ctx, id, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestProcessSecurityMatchesRunc: capabilities, no_new_privs and seccomp
// of containers as runc gives them, compared probe by probe.
func TestProcessSecurityMatchesRunc(t *testing.T) {
	e := newEnv(t)
	want := procSecurityProbes(t, e, "runc")
	got := procSecurityProbes(t, e, "hull")
	compareProbes(t, want, got)
	// The facts the comparison rests on, checked on runc's output so a
	// harness change cannot make both sides trivially equal.
	for name, must := range map[string]string{
		"caps drop ALL":      "CapEff:\t0000000000000000",
		"caps add NET_ADMIN": "CapEff:\t00000000a80435fb",
		"caps default":       "CapBnd:\t00000000a80425fb",
		// containerd gives a privileged container its own capabilities
		// (here all but CAP_SYS_RESOURCE, 24).
		"caps privileged":            "CapEff:\t000001f",
		"nnp on":                     "suid-ping=1",
		"nnp off":                    "suid-ping=0",
		"seccomp RuntimeDefault":     "unshare=1",
		"seccomp RuntimeDefault nnp": "Seccomp:\t2",
		"seccomp Unconfined":         "unshare=0",
	} {
		if !strings.Contains(want[name], must) {
			t.Errorf("runc's %q output lacks %q:\n%s", name, must, want[name])
		}
	}
}

func compareProbes(t *testing.T, runc, hull map[string]string) {
	t.Helper()
	names := make([]string, 0, len(runc))
	for n := range runc {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if runc[n] != hull[n] {
			t.Errorf("%s:\nrunc:\n%s\nhull:\n%s", n, runc[n], hull[n])
		} else {
			t.Logf("%s: same under both:\n%s", n, runc[n])
		}
	}
}

// runSysctlPod runs a pod with sysctls; a refused pod returns the error.
func (e *env) runSysctlPod(name, handler string, sysctls map[string]string) (*harness.Pod, error) {
	t := e.t
	t.Helper()
	cfg := &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: name, Uid: name + "-uid", Namespace: "hull-e2e"},
		Hostname:     name,
		LogDirectory: e.logRoot,
		Linux: &runtime.LinuxPodSandboxConfig{
			Sysctls: sysctls,
			SecurityContext: &runtime.LinuxSandboxSecurityContext{NamespaceOptions: &runtime.NamespaceOption{
				Network: runtime.NamespaceMode_POD, Pid: runtime.NamespaceMode_CONTAINER, Ipc: runtime.NamespaceMode_POD,
			}},
		},
	}
	ctx := e.ctx(3 * time.Minute)
	resp, err := e.cri.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		// Whatever a refused pod left is checked like a removed one's.
		pods, _ := e.cri.ListPodSandbox(context.Background(), &runtime.ListPodSandboxRequest{})
		var ids []string
		for _, p := range pods.GetItems() {
			if p.Metadata.GetName() == name {
				ids = append(ids, p.Id)
				e.cri.RemovePod(e.ctx(2*time.Minute), p.Id)
			}
		}
		for _, rerr := range e.ctd.Residue(10*time.Second, ids) {
			t.Errorf("after the refused pod %s: %v", name, rerr)
		}
		return nil, err
	}
	pod := &harness.Pod{ID: resp.PodSandboxId, Config: cfg, Handler: handler, LogDir: e.logRoot}
	netns, _ := e.cri.PodNetns(ctx, pod.ID)
	t.Cleanup(func() {
		ids, _ := e.cri.PodContainers(context.Background(), pod.ID)
		ids = append(ids, pod.ID)
		if err := e.cri.RemovePod(e.ctx(2*time.Minute), pod.ID); err != nil {
			t.Errorf("removing pod %s at cleanup: %v", name, err)
		}
		for _, err := range e.ctd.Residue(10*time.Second, ids, netns) {
			t.Errorf("after RemovePodSandbox: %v", err)
		}
	})
	return pod, nil
}

// TestSysctlsMatchRunc: a namespaced pod sysctl is visible in the pod's
// containers; a sysctl the kernel does not keep per namespace refuses
// the pod, naming the key.
func TestSysctlsMatchRunc(t *testing.T) {
	e := newEnv(t)
	out := map[string]string{}
	for _, h := range []string{"runc", "hull"} {
		pod, err := e.runSysctlPod("sysctl-"+h, h, map[string]string{"kernel.shm_rmid_forced": "1", "net.ipv4.ip_unprivileged_port_start": "77"})
		if err != nil {
			t.Fatalf("%s: pod with namespaced sysctls: %v", h, err)
		}
		id := e.startSecure(pod, "c", &runtime.LinuxContainerSecurityContext{})
		out[h] = e.sh(id, "cat /proc/sys/kernel/shm_rmid_forced /proc/sys/net/ipv4/ip_unprivileged_port_start")
		if _, err := e.runSysctlPod("sysctl-bad-"+h, h, map[string]string{"kernel.pid_max": "4096"}); err == nil || !strings.Contains(err.Error(), "kernel.pid_max") {
			t.Errorf("%s: pod with kernel.pid_max: %v, want a refusal naming the key", h, err)
		} else {
			t.Logf("%s refuses kernel.pid_max: %v", h, err)
		}
	}
	if out["runc"] != "1\n77\n" || out["hull"] != out["runc"] {
		t.Errorf("sysctls in the container: runc %q, hull %q, want %q", out["runc"], out["hull"], "1\n77\n")
	}
}
