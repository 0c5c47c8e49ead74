package faults

import (
	"context"
	"fmt"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// TestContainerdKilledDuringCreate: containerd is SIGKILLed while a pod is
// being created (its VM booting, or its container being created) and
// started again. CRI converges: every pod it lists is either usable or
// cleanly removable; once all are stopped and removed nothing is left, and
// the next pod starts normally.
func TestContainerdKilledDuringCreate(t *testing.T) {
	requireHull(t)
	for _, tc := range []struct {
		name string
		// vmBooting: kill once the pod's QEMU runs; else once the
		// pod's container is being created.
		vmBooting bool
	}{
		{"VMBooting", true},
		{"ContainerCreate", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A containerd of its own: what one case leaves must not
			// be counted against the next.
			e := newEnv(t)
			ctx := e.ctx(5 * time.Minute)
			name := "create-" + tc.name
			created := make(chan error, 1)
			var pod *harness.Pod
			inCreate := make(chan struct{})
			go func() {
				var err error
				pod, err = e.cri.RunPod(ctx, name, harness.HandlerHull, t.TempDir())
				if err == nil && !tc.vmBooting {
					close(inCreate)
					_, err = e.cri.StartNew(ctx, pod, sleeper("a"))
				}
				created <- err
			}()
			if tc.vmBooting {
				if err := poll(ctx, func() bool { return len(e.ctd.QEMUProcesses()) > 0 }); err != nil {
					t.Fatalf("waiting for the pod's QEMU: %v", err)
				}
			} else {
				select {
				case <-inCreate:
				case err := <-created:
					t.Fatalf("RunPodSandbox: %v", err)
				}
				time.Sleep(150 * time.Millisecond)
			}
			if err := e.ctd.Kill(); err != nil {
				t.Fatal(err)
			}
			err := <-created
			t.Logf("the creation interrupted by containerd's SIGKILL: %v", err)
			if err := e.ctd.Start(ctx); err != nil {
				t.Fatal(err)
			}
			e.converge(t, ctx)
			e.nextPodWorks(t, ctx, name+"-next")
		})
	}
}

// TestContainerdKilledDuringDelete: containerd is SIGKILLed while a pod is
// being stopped (shortly after StopPodSandbox began, and once the pod's
// QEMU is gone) and started again; CRI converges and nothing is left.
func TestContainerdKilledDuringDelete(t *testing.T) {
	requireHull(t)
	for _, tc := range []struct {
		name string
		when func(ctx context.Context, qemu int) error
	}{
		{"StopBegun", func(ctx context.Context, _ int) error {
			time.Sleep(200 * time.Millisecond)
			return nil
		}},
		{"VMGone", func(ctx context.Context, qemu int) error {
			return poll(ctx, func() bool { return harness.ProcessGone(qemu) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := e.ctx(5 * time.Minute)
			name := "delete-" + tc.name
			pod, netns := e.runPod(name, harness.HandlerHull, harness.PodOptions{})
			_ = netns
			e.startRunning(pod, sleeper("a"))
			qemu, ok := e.ctd.PodQEMU(pod.ID)
			if !ok {
				t.Fatal("no QEMU")
			}
			stopped := make(chan error, 1)
			go func() {
				_, err := e.cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: pod.ID})
				if err == nil {
					_, err = e.cri.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: pod.ID})
				}
				stopped <- err
			}()
			if err := tc.when(ctx, qemu.Pid); err != nil {
				t.Fatalf("waiting for the moment to kill containerd: %v", err)
			}
			if err := e.ctd.Kill(); err != nil {
				t.Fatal(err)
			}
			t.Logf("the deletion interrupted by containerd's SIGKILL: %v", <-stopped)
			if err := e.ctd.Start(ctx); err != nil {
				t.Fatal(err)
			}
			e.converge(t, ctx)
			e.nextPodWorks(t, ctx, name+"-next")
		})
	}
}

// converge does what kubelet would after containerd's restart: list the
// pods, try each (a usable pod answers; its state is logged), stop and
// remove them all. It fails the test when that does not leave containerd
// with no pods and the host with nothing of them within a minute.
func (e *env) converge(t *testing.T, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var lastErr error
	for {
		pods, err := e.cri.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
		if err == nil {
			for _, p := range pods.Items {
				cts, _ := e.cri.PodContainers(ctx, p.Id)
				var states []string
				for _, id := range cts {
					st, err := e.cri.Status(ctx, id)
					states = append(states, fmt.Sprintf("%.12s %v %v", id, st.GetState(), err))
				}
				t.Logf("after the restart: pod %.12s %s, containers %v", p.Id, p.State, states)
			}
			_, err = e.cri.RemoveAllPods(ctx)
			if err == nil {
				pods, err = e.cri.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
				if err == nil && len(pods.Items) > 0 {
					err = fmt.Errorf("%d pods still listed after their removal", len(pods.Items))
				}
			}
		}
		if err == nil {
			break
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Errorf("CRI does not converge after containerd's restart: %v", lastErr)
			break
		}
		time.Sleep(time.Second)
	}
	if lastErr != nil {
		t.Logf("converged after retrying; last error: %v", lastErr)
	}
	for _, err := range e.ctd.Leftovers(15 * time.Second) {
		t.Errorf("leak after converging: %v", err)
	}
}

// nextPodWorks runs a pod with a container and removes it.
func (e *env) nextPodWorks(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	pod, err := e.cri.RunPod(ctx, name, harness.HandlerHull, t.TempDir())
	if err != nil {
		t.Fatalf("the next pod: %v", err)
	}
	id, err := e.cri.StartNew(ctx, pod, sleeper("next"))
	if err == nil {
		_, err = e.cri.WaitState(ctx, id, runtime.ContainerState_CONTAINER_RUNNING)
	}
	if err != nil {
		t.Errorf("the next pod's container: %v", err)
	}
	if err := e.cri.RemovePod(ctx, pod.ID); err != nil {
		t.Errorf("removing the next pod: %v", err)
	}
	for _, err := range e.ctd.Leftovers(15 * time.Second) {
		t.Errorf("leak after the next pod: %v", err)
	}
}

// poll checks cond every 20 ms until it holds or ctx ends.
func poll(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
