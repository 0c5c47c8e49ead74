package faults

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// TestAgentFailureInShimLog (issue 7): an agent that fails inside the VM
// leaves its error in the shim's log. The agent-fatal failpoint makes the
// guest agent fail as a fatal error would: it logs the error to the guest
// console and powers the guest off. The shim forwards the guest console
// into its log, which containerd writes to its own; RunPodSandbox fails
// and nothing is left.
func TestAgentFailureInShimLog(t *testing.T) {
	requireFailpoints(t)
	e := newFailpointEnv(t)
	ctx := e.ctx(3 * time.Minute)
	pod, err := e.cri.RunPodWith(ctx, "agentfatal", harness.HandlerHullFailpoints, t.TempDir(), harness.PodOptions{
		Annotations: map[string]string{harness.FailpointAnnotation: failpoint.AgentFatal}})
	if err == nil {
		e.cri.RemovePod(ctx, pod.ID)
		t.Fatal("RunPodSandbox succeeded although the guest agent failed")
	}
	t.Logf("RunPodSandbox failed as it should: %v", err)

	want := "failpoint " + failpoint.AgentFatal + ": injected failure"
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(e.ctd.LogFile)
		log := string(b)
		var hit string
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "guest console") && strings.Contains(line, want) {
				hit = line
				break
			}
		}
		if hit != "" {
			if !strings.Contains(hit, "sandbox=") {
				t.Errorf("the shim's line carries no sandbox key: %s", hit)
			}
			t.Logf("shim log: %s", hit)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's error %q is not in the shim's log; containerd log tail:\n%s", want, e.ctd.Log(60))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, err := range e.ctd.Leftovers(15 * time.Second) {
		t.Errorf("leak after the failed pod: %v", err)
	}
}
