package faults

import (
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// TestFailpoints injects a failure at each creation step (failpoint.Steps)
// through the "hull-failpoints" handler:
//   - a sandbox step (including the sandbox container's, "sandbox-"...),
//     armed by a pod annotation: RunPodSandbox fails with an error naming
//     the step;
//   - a container step, armed by the container's annotation in a healthy
//     pod: CreateContainer or StartContainer fails with an error naming
//     the step, and the pod stays healthy.
//
// After each, nothing of the failed pod or container is left, and the
// next pod (or container) starts normally.
func TestFailpoints(t *testing.T) {
	requireFailpoints(t)
	e := newFailpointEnv(t)
	for i, step := range failpoint.Steps {
		t.Run(step, func(t *testing.T) {
			name := "fp-" + strings.ReplaceAll(step, "-", "")
			if isSandboxStep(step) {
				sandboxStep(t, e, step, name)
			} else {
				containerStep(t, e, step, name)
			}
			// The next pod starts normally (here, so that every step
			// is followed by one).
			if isSandboxStep(step) || i == len(failpoint.Steps)-1 {
				ctx := e.ctx(3 * time.Minute)
				pod, err := e.cri.RunPod(ctx, name+"-next", harness.HandlerHullFailpoints, t.TempDir())
				if err != nil {
					t.Fatalf("the pod after the failure at %s: %v", step, err)
				}
				id, err := e.cri.StartNew(ctx, pod, sleeper("next"))
				if err == nil {
					_, err = e.cri.WaitState(ctx, id, runtime.ContainerState_CONTAINER_RUNNING)
				}
				if err != nil {
					t.Errorf("the container of the pod after the failure at %s: %v", step, err)
				}
				if err := e.cri.RemovePod(ctx, pod.ID); err != nil {
					t.Errorf("removing the pod after the failure: %v", err)
				}
				for _, err := range e.ctd.Leftovers(15 * time.Second) {
					t.Errorf("leak after the pod that followed the failure at %s: %v", step, err)
				}
			}
		})
	}
}

func isSandboxStep(step string) bool {
	switch step {
	case failpoint.StateCreate, failpoint.VMDir, failpoint.QEMUStart, failpoint.AgentConnect:
		return true
	}
	return strings.HasPrefix(step, failpoint.SandboxPrefix)
}

// namesStep says whether msg names step. The sandbox container's steps
// fail as the container step they are ("failpoint guest-create" for
// sandbox-guest-create).
func namesStep(msg, step string) bool {
	return strings.Contains(msg, "failpoint "+step) ||
		strings.Contains(msg, "failpoint "+strings.TrimPrefix(step, failpoint.SandboxPrefix))
}

func sandboxStep(t *testing.T, e *env, step, name string) {
	ctx := e.ctx(3 * time.Minute)
	start := time.Now()
	pod, err := e.cri.RunPodWith(ctx, name, harness.HandlerHullFailpoints, t.TempDir(), harness.PodOptions{
		Annotations: map[string]string{harness.FailpointAnnotation: step}})
	if err == nil {
		t.Errorf("RunPodSandbox with the failpoint %s armed succeeded (pod %s)", step, pod.ID)
		e.cri.RemovePod(ctx, pod.ID)
	} else {
		t.Logf("RunPodSandbox failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
		if !namesStep(err.Error(), step) {
			t.Errorf("RunPodSandbox's error does not name the step %s: %v", step, err)
		}
	}
	pods, err := e.cri.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		t.Errorf("pod %s (%s) listed after the failed RunPodSandbox", p.Id, p.State)
		e.cri.RemovePod(ctx, p.Id)
	}
	for _, err := range e.ctd.Leftovers(15 * time.Second) {
		t.Errorf("leak after the failure at %s: %v", step, err)
	}
}

func containerStep(t *testing.T, e *env, step, name string) {
	ctx := e.ctx(3 * time.Minute)
	pod, err := e.cri.RunPod(ctx, name, harness.HandlerHullFailpoints, t.TempDir())
	if err != nil {
		t.Fatalf("RunPodSandbox of the pod for %s: %v", step, err)
	}
	defer func() {
		if err := e.cri.RemovePod(ctx, pod.ID); err != nil {
			t.Errorf("removing the pod: %v", err)
		}
		for _, err := range e.ctd.Leftovers(15 * time.Second) {
			t.Errorf("leak after the failure at %s and the pod's removal: %v", step, err)
		}
	}()
	first := e.startRunningIn(t, pod, sleeper("first"))
	bad := sleeper("bad")
	bad.Annotations = map[string]string{harness.FailpointAnnotation: step}
	id, err := e.cri.CreateContainer(ctx, pod, bad)
	call := "CreateContainer"
	if err == nil {
		call = "StartContainer"
		_, err = e.cri.StartContainer(ctx, &runtime.StartContainerRequest{ContainerId: id})
	}
	if err == nil {
		t.Errorf("the container with the failpoint %s armed started", step)
	} else {
		t.Logf("%s failed: %v", call, err)
		if !namesStep(err.Error(), step) {
			t.Errorf("%s's error does not name the step %s: %v", call, step, err)
		}
	}
	if id != "" {
		// A container that was created but failed to start: removable,
		// and gone once removed.
		if _, err := e.cri.RemoveContainer(ctx, &runtime.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Errorf("RemoveContainer of the failed container: %v", err)
		}
		for _, err := range e.ctd.Residue(15*time.Second, []string{id}) {
			t.Errorf("leak of the failed container after its removal: %v", err)
		}
	}
	// The pod is healthy: its first container runs and answers, and the
	// next container starts normally.
	if st, err := e.cri.PodState(ctx, pod); err != nil || st != runtime.PodSandboxState_SANDBOX_READY {
		t.Errorf("pod after the failed container = %v, %v; want SANDBOX_READY", st, err)
	}
	if _, _, code, err := e.cri.Exec(ctx, first, 30*time.Second, "true"); err != nil || code != 0 {
		t.Errorf("exec in the pod's first container after the failure: exit %d, %v", code, err)
	}
	e.startRunningIn(t, pod, sleeper("next"))
}

// startRunningIn is startRunning for a subtest.
func (e *env) startRunningIn(t *testing.T, pod *harness.Pod, ct harness.Container) string {
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
