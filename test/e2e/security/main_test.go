// Package security runs the same probes of a container's privileges in
// pods under runc and under Hull (CRI, as kubelet does) and compares
// what they show: Hull must give at least what runc gives.
//
// Prerequisites are those of test/e2e/cri (`make test` provides them);
// without them the tests skip, with HULL_E2E=1 they fail.
package security

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// env is one test's private containerd with runc and hull handlers.
type env struct {
	t       *testing.T
	ctd     *harness.Containerd
	cri     *harness.CRI
	logRoot string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	a := harness.RequireHull(t)
	dir, err := os.MkdirTemp("", "hull-sec-")
	if err != nil {
		t.Fatal(err)
	}
	// Checked after every cleanup below.
	leakcheck.Register(t, dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, logRoot: filepath.Join(dir, "pods")}
	cfg := filepath.Join(dir, "hull.toml")
	data := fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n\n[agent]\ndial_timeout = 120\n", a.Kernel, a.Initrd)
	if err := os.WriteFile(cfg, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: a.ShimDir, HullConfig: cfg}
	e.ctd, e.cri = harness.LaunchT(t, opts, 60, nil, harness.CRINamespace, "default")
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	suid := harness.Image{Ref: suidImage, Cmd: []string{"sh"}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/",
		Files: []harness.File{{Path: "suid/busybox", Mode: 0o4755, Body: busybox}}}
	if err := e.ctd.ImportImages(e.ctx(2*time.Minute), "suid.tar", []harness.Image{suid}, harness.CRINamespace); err != nil {
		t.Fatal(err)
	}
	return e
}

// suidImage is busybox with a setuid-root copy of itself, /suid/busybox.
const suidImage = "hull.test/suid-busybox:1"

func (e *env) ctx(limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	e.t.Cleanup(cancel)
	return ctx
}

// podOptions are the pod settings the probes vary.
type podOptions struct {
	pid        runtime.NamespaceMode
	privileged bool
}

// runPod runs a pod and registers its removal and the check that nothing
// of it remains.
func (e *env) runPod(name, handler string, o podOptions) *harness.Pod {
	t := e.t
	t.Helper()
	logDir := filepath.Join(e.logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: name, Uid: name + "-uid", Namespace: "hull-e2e"},
		Hostname:     name,
		LogDirectory: logDir,
		Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			Privileged: o.privileged,
			NamespaceOptions: &runtime.NamespaceOption{
				Network: runtime.NamespaceMode_POD, Pid: o.pid, Ipc: runtime.NamespaceMode_POD,
			},
		}},
	}
	ctx := e.ctx(3 * time.Minute)
	resp, err := e.cri.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox %s (handler %s): %v", name, handler, err)
	}
	pod := &harness.Pod{ID: resp.PodSandboxId, Config: cfg, Handler: handler, LogDir: logDir}
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
	return pod
}

// container is what a probe container needs of CRI's ContainerConfig.
type container struct {
	name       string
	tty        bool
	privileged bool
	readonly   bool
	cmd        []string // default: sleep
	exits      bool     // cmd exits: wait for that, not for it to run
}

// start creates and starts c (busybox sleeping, or its cmd) and waits
// until it runs (or, for a cmd that exits, until it has exited).
func (e *env) start(pod *harness.Pod, c container) string {
	t := e.t
	t.Helper()
	ctx := e.ctx(3 * time.Minute)
	resp, err := e.cri.RuntimeServiceClient.CreateContainer(ctx, &runtime.CreateContainerRequest{
		PodSandboxId: pod.ID,
		Config: &runtime.ContainerConfig{
			Metadata: &runtime.ContainerMetadata{Name: c.name},
			Image:    &runtime.ImageSpec{Image: harness.BusyboxImage},
			Command:  c.command(),
			LogPath:  c.name + ".log",
			Tty:      c.tty,
			Linux: &runtime.LinuxContainerConfig{SecurityContext: &runtime.LinuxContainerSecurityContext{
				Privileged: c.privileged, ReadonlyRootfs: c.readonly,
			}},
		},
		SandboxConfig: pod.Config,
	})
	if err != nil {
		t.Fatalf("creating container %s: %v", c.name, err)
	}
	id := resp.ContainerId
	if _, err := e.cri.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: id}); err != nil {
		t.Fatalf("starting container %s: %v", c.name, err)
	}
	want := runtime.ContainerState_CONTAINER_RUNNING
	if c.exits {
		want = runtime.ContainerState_CONTAINER_EXITED
	}
	if _, err := e.cri.WaitState(ctx, id, want); err != nil {
		t.Fatal(err)
	}
	return id
}

func (c container) command() []string {
	if c.cmd != nil {
		return c.cmd
	}
	return []string{"sleep", "2147483647"}
}

// sh runs script in the container and returns its stdout (exit status
// and stderr are the script's business).
func (e *env) sh(id, script string) string {
	e.t.Helper()
	out, errOut, _, err := e.cri.Exec(e.ctx(2*time.Minute), id, time.Minute, "sh", "-c", script)
	if err != nil {
		e.t.Fatalf("ExecSync in %s: %v (stderr %q)", id, err, errOut)
	}
	return out
}
