package cri

import (
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

func TestRuncOOMKilled(t *testing.T) {
	requireBase(t)
	oomScenario(t, newEnv(t), harness.HandlerRunc)
}

// TestHullOOMKilled: a container that allocates past its memory limit is
// killed by the guest's OOM killer and CRI reports exit 137 with reason
// OOMKilled, as for runc (issue 14); a container that exits 137 by a
// plain SIGKILL is not OOMKilled.
func TestHullOOMKilled(t *testing.T) {
	requireHull(t)
	oomScenario(t, newEnv(t), harness.HandlerHull)
}

func oomScenario(t *testing.T, e *env, handler string) {
	ctx := e.ctx(8 * time.Minute)
	pod := e.runPod("oom-"+handler, handler)
	start := func(name, script string, limit int64) string {
		t.Helper()
		resp, err := e.cri.RuntimeServiceClient.CreateContainer(ctx, &runtime.CreateContainerRequest{
			PodSandboxId: pod.ID,
			Config: &runtime.ContainerConfig{
				Metadata: &runtime.ContainerMetadata{Name: name},
				Image:    &runtime.ImageSpec{Image: harness.BusyboxImage},
				Command:  []string{"sh", "-c", script},
				LogPath:  name + ".log",
				Linux: &runtime.LinuxContainerConfig{Resources: &runtime.LinuxContainerResources{
					MemoryLimitInBytes: limit,
				}},
			},
			SandboxConfig: pod.Config,
		})
		if err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		if _, err := e.cri.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: resp.ContainerId}); err != nil {
			t.Fatalf("starting %s: %v", name, err)
		}
		return resp.ContainerId
	}
	hog := start("hog", "head -c 200m /dev/zero | tail", 32<<20)
	killed := start("killed", "kill -9 $$", 32<<20)
	for _, c := range []struct {
		id, name, reason string
	}{{hog, "hog", "OOMKilled"}, {killed, "killed", "Error"}} {
		st, err := e.cri.WaitExited(ctx, c.id)
		if err != nil {
			t.Fatalf("waiting for %s: %v", c.name, err)
		}
		if st.ExitCode != 137 || st.Reason != c.reason {
			t.Errorf("%s: exit %d, reason %q; want 137, %q", c.name, st.ExitCode, st.Reason, c.reason)
		}
	}
}
