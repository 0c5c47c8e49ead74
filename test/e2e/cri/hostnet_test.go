package cri

import (
	"strings"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// hostNetworkConfig is a pod that asks for the host's network namespace
// (hostNetwork: true); kubelet sets no hostname for such a pod (its UTS
// namespace is the host's too).
func hostNetworkConfig(name, logDir string) *runtime.PodSandboxConfig {
	return &runtime.PodSandboxConfig{
		Metadata:     &runtime.PodSandboxMetadata{Name: name, Uid: name + "-uid", Namespace: "hull-e2e"},
		LogDirectory: logDir,
		Linux: &runtime.LinuxPodSandboxConfig{SecurityContext: &runtime.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtime.NamespaceOption{Network: runtime.NamespaceMode_NODE, Pid: runtime.NamespaceMode_CONTAINER, Ipc: runtime.NamespaceMode_POD},
		}},
	}
}

// TestRuncHostNetwork: runc runs a hostNetwork pod (the baseline).
func TestRuncHostNetwork(t *testing.T) {
	requireBase(t)
	e := newEnv(t)
	ctx := e.ctx(2 * time.Minute)
	resp, err := e.cri.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: hostNetworkConfig("hostnet", t.TempDir()), RuntimeHandler: harness.HandlerRunc})
	if err != nil {
		t.Fatalf("runc RunPodSandbox with hostNetwork: %v", err)
	}
	if err := e.cri.RemovePod(ctx, resp.PodSandboxId); err != nil {
		t.Fatal(err)
	}
	e.checkNoResidue([]string{resp.PodSandboxId})
}

// TestHullHostNetwork: Hull refuses a hostNetwork pod (a VM cannot share
// the host's network namespace) with an error naming the setting, and
// leaves nothing behind (issue 14).
func TestHullHostNetwork(t *testing.T) {
	requireHull(t)
	e := newEnv(t)
	ctx := e.ctx(3 * time.Minute)
	before := stateEntries(e.ctd.StateDir)
	resp, err := e.cri.RunPodSandbox(ctx, &runtime.RunPodSandboxRequest{Config: hostNetworkConfig("hostnet", t.TempDir()), RuntimeHandler: harness.HandlerHull})
	if err == nil {
		e.cri.RemovePod(ctx, resp.PodSandboxId)
		t.Fatal("RunPodSandbox with hostNetwork succeeded on hull")
	}
	if !strings.Contains(err.Error(), "hostNetwork") {
		t.Errorf("RunPodSandbox's error does not name hostNetwork: %v", err)
	}
	t.Logf("RunPodSandbox error: %v", err)
	pods, err := e.cri.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		t.Errorf("pod %s (%s) left after the refused RunPodSandbox", p.Id, p.State)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(e.ctd.ShimProcesses(shimName)) != 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if p := e.ctd.ShimProcesses(shimName); len(p) != 0 {
		t.Errorf("hull shim still running after the refused RunPodSandbox: %v", p)
	}
	for _, n := range stateEntries(e.ctd.StateDir) {
		if !contains(before, n) {
			t.Errorf("left in %s after the refused RunPodSandbox: %s", e.ctd.StateDir, n)
		}
	}
	e.checkNoResidue(e.ctd.LoggedIDs())
}
