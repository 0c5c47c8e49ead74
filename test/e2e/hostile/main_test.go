// Package hostile is the red-team suite of issue 10: it acts as a
// compromised guest against pods run through a real containerd over CRI
// with Hull's shim and QEMU, and checks that the host holds
// (docs/security.md): plantings in the directory QEMU exports, and from a
// privileged container in the guest; setuid files and device nodes made
// by guest root; hostPath volumes that lead to the host's kernel
// interfaces; read-only volumes. After each pod: StopPodSandbox and
// RemovePodSandbox succeed, a canary elsewhere on the host is
// byte-identical, no mount of the pod remains, `hull gc` has nothing of
// it to collect and the harness's leak check is clean.
//
// Prerequisites are those of test/e2e/cri (`make test` provides them).
package hostile

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// assets are what `make test` names: set by requireHull.
var assets harness.Assets

// env is one test's private containerd with its CRI client.
type env struct {
	t       *testing.T
	dir     string
	ctd     *harness.Containerd
	cri     *harness.CRI
	logRoot string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	requireHull(t)
	dir, err := os.MkdirTemp("", "hull-hostile-")
	if err != nil {
		t.Fatal(err)
	}
	leakcheck.Register(t, dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	cfg := filepath.Join(dir, "hull.toml")
	writeFile(t, cfg, fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n\n[agent]\ndial_timeout = 120\n", assets.Kernel, assets.Initrd))
	e := &env{t: t, dir: dir, logRoot: filepath.Join(dir, "pods")}
	opts := harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: assets.ShimDir, HullConfig: cfg, BrokenHullConfig: cfg}
	e.ctd, e.cri = harness.LaunchT(t, opts, 60, nil, harness.CRINamespace)
	return e
}

func (e *env) ctx(limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	e.t.Cleanup(cancel)
	return ctx
}

// pod is a running hull pod and what the test needs to check after it.
type pod struct {
	*harness.Pod
	netns string
}

// runPod runs a privileged hull pod (its containers may be privileged).
func (e *env) runPod(name string) *pod {
	t := e.t
	t.Helper()
	logDir := filepath.Join(e.logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := e.cri.RunPodWith(e.ctx(5*time.Minute), name, harness.HandlerHull, logDir, harness.PodOptions{Privileged: true})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	netns, _ := e.cri.PodNetns(e.ctx(time.Minute), p.ID)
	pd := &pod{Pod: p, netns: netns}
	t.Cleanup(func() {
		// A no-op when the test removed the pod itself.
		e.cri.RemovePod(context.Background(), p.ID)
	})
	return pd
}

// create creates and starts a container sleeping forever.
func (e *env) create(p *pod, name string, privileged bool, mounts []*runtime.Mount) (string, error) {
	id, err := e.createOnly(p, name, privileged, mounts)
	if err != nil {
		return "", err
	}
	return id, e.start(id)
}

// start starts a created container: the shim's Create of its task runs
// now (CRI creates containerd's container, not the task, in
// CreateContainer).
func (e *env) start(id string) error {
	_, err := e.cri.StartContainer(e.ctx(3*time.Minute), &runtime.StartContainerRequest{ContainerId: id})
	return err
}

// createOnly creates a container sleeping forever, without starting it.
func (e *env) createOnly(p *pod, name string, privileged bool, mounts []*runtime.Mount) (string, error) {
	ctx := e.ctx(3 * time.Minute)
	linux := &runtime.LinuxContainerConfig{}
	if privileged {
		linux.SecurityContext = &runtime.LinuxContainerSecurityContext{Privileged: true}
	}
	resp, err := e.cri.RuntimeServiceClient.CreateContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: p.ID,
		Config: &runtime.ContainerConfig{
			Metadata:    &runtime.ContainerMetadata{Name: name},
			Image:       &runtime.ImageSpec{Image: harness.BusyboxImage},
			Command:     []string{"sleep", "100000"},
			LogPath:     name + ".log",
			Linux:       linux,
			Mounts:      mounts,
			Annotations: p.Config.Annotations,
		},
		SandboxConfig: p.Config,
	})
	if err != nil {
		return "", err
	}
	return resp.ContainerId, nil
}

func (e *env) mustCreate(p *pod, name string, privileged bool, mounts []*runtime.Mount) string {
	e.t.Helper()
	id, err := e.create(p, name, privileged, mounts)
	if err != nil {
		e.t.Fatalf("container %s: %v", name, err)
	}
	return id
}

// sh runs a shell command in a container and returns its output and
// exit code.
func (e *env) sh(id, script string) (string, int32) {
	e.t.Helper()
	out, errOut, code, err := e.cri.Exec(e.ctx(2*time.Minute), id, time.Minute, "sh", "-c", script)
	if err != nil {
		e.t.Fatalf("exec in %s: %v", id, err)
	}
	return strings.TrimSpace(out + errOut), code
}

// removeAndCheck stops and removes the pod, which must succeed, then
// checks what must hold after any guest: no mount of the pod, nothing of
// it left (harness residue), `hull gc` has nothing of it to collect.
func (e *env) removeAndCheck(p *pod) {
	t := e.t
	t.Helper()
	ids, _ := e.cri.PodContainers(context.Background(), p.ID)
	ids = append(ids, p.ID)
	ctx := e.ctx(3 * time.Minute)
	if _, err := e.cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: p.ID}); err != nil {
		t.Errorf("StopPodSandbox %s: %v", p.ID, err)
	}
	if _, err := e.cri.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: p.ID}); err != nil {
		t.Errorf("RemovePodSandbox %s: %v", p.ID, err)
	}
	for _, err := range e.ctd.Residue(20*time.Second, ids, p.netns) {
		t.Errorf("after RemovePodSandbox: %v", err)
	}
	if ms := mountsNaming(p.ID); len(ms) > 0 {
		t.Errorf("mounts of pod %s left: %v", p.ID, ms)
	}
	out, err := exec.Command(assets.Hull, "gc", "--root", e.ctd.StateDir).CombinedOutput()
	t.Logf("hull gc: %s", out)
	if err != nil {
		t.Errorf("hull gc: %v", err)
	}
	if strings.Contains(string(out), p.ID) {
		t.Errorf("hull gc collected something of pod %s:\n%s", p.ID, out)
	}
}

// mountsNaming lists the mount points whose path names id.
func mountsNaming(id string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.Contains(f[4], id) {
			out = append(out, f[4])
		}
	}
	return out
}

func writeFile(t *testing.T, name, s string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// requireHull skips (or, under HULL_E2E=1, fails) a test that needs
// what `make test` provides, and sets assets.
func requireHull(t *testing.T) {
	t.Helper()
	assets = harness.RequireHull(t)
}
