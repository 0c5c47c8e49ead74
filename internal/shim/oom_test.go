package shim

import (
	"testing"
	"time"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// An init process the guest reports OOM-killed publishes TaskOOM before
// TaskExit; an exec or a plain exit publishes no TaskOOM.
func TestOOMBeforeExit(t *testing.T) {
	s, pub, _ := testService(t)
	tk := addTask(s, "c1")
	p := tk.init
	p.started = true
	s.reportOOM(tk, p, &agent.WaitProcessResponse{ExitStatus: 137, OomKilled: true})
	s.reportExit(tk, p, 137, time.Now())
	got := pub.wait(t, 2)
	if got[0] != "/tasks/oom" || got[1] != "/tasks/exit" {
		t.Errorf("events = %v, want oom then exit", got)
	}

	tk2 := addTask(s, "c2")
	tk2.init.started = true
	s.reportOOM(tk2, tk2.init, &agent.WaitProcessResponse{ExitStatus: 1})
	s.reportOOM(tk2, newProc("c2", "e1", stdio{}), &agent.WaitProcessResponse{OomKilled: true})
	s.reportExit(tk2, tk2.init, 1, time.Now())
	if got := pub.wait(t, 1); len(got) != 3 || got[2] != "/tasks/exit" {
		t.Errorf("events = %v, want oom, exit, exit (no oom for c2)", got)
	}
}
