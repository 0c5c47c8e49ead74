package faults

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// idleLimit is the most CPU all of a round's shims may use while their
// pods idle (issue 5: under 1% of one core).
const idleLimit = 0.01

// idleSettle is how long after the round's last pod came up the idle CPU
// is measured (over 10 s). Shims younger than about 30 s still wake up a
// few times a second; measured 5 s after the last pod (logged as "early"),
// 50 shims used 0.6-1.3% of a core.
const idleSettle = 30 * time.Second

// TestChurn is issue 5's churn: HULL_CHURN_PODS pods (50), each running a
// container, created HULL_CHURN_BATCH (10) at a time, then all removed;
// HULL_CHURN_ROUNDS (3) rounds; no failure, no leak, and while the
// round's pods run idle the shims together use under 1% of one core.
func TestChurn(t *testing.T) {
	requireHull(t)
	pods, batch, rounds := envInt("HULL_CHURN_PODS", 50), envInt("HULL_CHURN_BATCH", 10), envInt("HULL_CHURN_ROUNDS", 3)
	if pods <= 0 || rounds <= 0 {
		t.Skip("HULL_CHURN_PODS or HULL_CHURN_ROUNDS is 0")
	}
	e := newEnv(t)
	start := time.Now()
	res := harness.Churn(e.ctx(60*time.Minute), e.ctd, e.cri, harness.ChurnOptions{
		Handler: harness.HandlerHull, Pods: pods, Batch: batch, Rounds: rounds,
		LogRoot: filepath.Join(e.dir, "churn"), EarlySettle: 5 * time.Second, Settle: idleSettle, IdleWindow: harness.ShimIdlePeriod,
		Logf: t.Logf,
	})
	t.Logf("churn: %d rounds of %d pods (%d at a time) in %v", rounds, pods, batch, time.Since(start).Round(time.Second))
	for i, r := range res {
		t.Logf("round %d: start p50 %v p95 %v, teardown p50 %v p95 %v, peak shim CPU %.1f%%, idle: %d shims %.3f%% of a core (%.2f wake-ups/s each), their QEMUs %.1f%%",
			i, harness.Percentile(r.Start, 50).Round(time.Millisecond), harness.Percentile(r.Start, 95).Round(time.Millisecond),
			harness.Percentile(r.Teardown, 50).Round(time.Millisecond), harness.Percentile(r.Teardown, 95).Round(time.Millisecond),
			100*r.PeakCPU, r.Shims, 100*r.IdleCPU, r.IdleWakeups, 100*r.IdleQEMUCPU)
		t.Logf("round %d: 5 s after the last pod came up: %.3f%% of a core, %.2f wake-ups/s per shim", i, 100*r.EarlyIdleCPU, r.EarlyWakeups)
		for _, err := range r.Failures {
			t.Errorf("round %d: failure: %v", i, err)
		}
		for _, err := range r.Leaks {
			t.Errorf("round %d: leak: %v", i, err)
		}
		if len(r.Start) != pods {
			t.Errorf("round %d: %d of %d pods came up", i, len(r.Start), pods)
		}
		if r.Shims != pods {
			t.Errorf("round %d: %d shims ran while idle, want one per pod (%d)", i, r.Shims, pods)
		}
		if r.IdleCPU >= idleLimit {
			t.Errorf("round %d: the %d idle shims used %.3f%% of a core together; want under %.0f%%", i, r.Shims, 100*r.IdleCPU, 100*idleLimit)
		}
	}
	if len(res) != rounds {
		t.Errorf("%d of %d rounds ran", len(res), rounds)
	}
	// A clone whose agent does not answer is booted instead, 20 s later.
	// One in 10-20 clones restored at once closes its agent port before
	// answering; the shim connects again, which revives most but not all
	// of them (docs/agent-channel.md, an open problem): counted here, not
	// failed, as the pods still come up (booted).
	closed, silent := bootedClones(e.ctd)
	t.Logf("connections to an agent made again: %d; clones booted after closing their port unanswered: %d %v; booted without closing it: %d %v",
		logCount(e.ctd, "connecting to the guest agent again"), len(closed), closed, len(silent), silent)
}

// logCount is how many lines of containerd's log (the shims' included)
// name s.
func logCount(ctd *harness.Containerd, s string) int {
	if l := ctd.LogLines(s); l != "" {
		return strings.Count(l, "\n") + 1
	}
	return 0
}

var sandboxField = regexp.MustCompile(`sandbox=([0-9a-f]{64})`)

// bootedClones are the sandboxes whose restored VM did not answer and was
// booted: closed, those whose guest had closed its agent port after the
// restore (QEMU's VSERPORT_CHANGE, in the shim's log); silent, the others.
func bootedClones(ctd *harness.Containerd) (closed, silent []string) {
	b, _ := os.ReadFile(ctd.LogFile)
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		m := sandboxField.FindStringSubmatch(l)
		if m == nil || !strings.Contains(l, "did not answer; booting it") {
			continue
		}
		portClosed := false
		for j := i - 1; j >= 0; j-- {
			if !strings.Contains(lines[j], m[0]) {
				continue
			}
			if strings.Contains(lines[j], `msg="vm restored"`) {
				break
			}
			if strings.Contains(lines[j], "event=VSERPORT_CHANGE") && strings.Contains(lines[j], `open\": false`) {
				portClosed = true
			}
		}
		if portClosed {
			closed = append(closed, m[1][:12])
		} else {
			silent = append(silent, m[1][:12])
		}
	}
	return closed, silent
}
