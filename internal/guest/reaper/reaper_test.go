package reaper

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeWait returns queued statuses, then "no child ready".
type fakeWait struct {
	q []struct {
		pid int
		ws  unix.WaitStatus
	}
}

func (f *fakeWait) push(pid int, ws unix.WaitStatus) {
	f.q = append(f.q, struct {
		pid int
		ws  unix.WaitStatus
	}{pid, ws})
}

func (f *fakeWait) wait() (int, unix.WaitStatus, error) {
	if len(f.q) == 0 {
		return 0, 0, nil
	}
	e := f.q[0]
	f.q = f.q[1:]
	return e.pid, e.ws, nil
}

func exitStatus(code int) unix.WaitStatus { return unix.WaitStatus(code << 8) }

func recv(t *testing.T, ch <-chan Exit) Exit {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(time.Second):
		t.Fatal("no exit delivered")
		return Exit{}
	}
}

func TestStatusBeforeRegistration(t *testing.T) {
	f := &fakeWait{}
	r := newReaper(f.wait)
	f.push(42, exitStatus(3))
	r.Reap()
	e := recv(t, r.Register(42))
	if e.Pid != 42 || e.Status != 3 || e.Signal != 0 {
		t.Fatalf("got %+v, want pid 42 status 3", e)
	}
	if len(r.pending) != 0 || len(r.order) != 0 {
		t.Fatalf("pending not cleared: %v %v", r.pending, r.order)
	}
}

func TestRegisterThenExit(t *testing.T) {
	f := &fakeWait{}
	r := newReaper(f.wait)
	ch := r.Register(7)
	select {
	case e := <-ch:
		t.Fatalf("early exit %+v", e)
	default:
	}
	f.push(7, unix.WaitStatus(9)) // killed by SIGKILL
	f.push(8, exitStatus(0))      // someone else's
	r.Reap()
	e := recv(t, ch)
	if e.Status != 137 || e.Signal != 9 {
		t.Fatalf("got %+v, want 137/9", e)
	}
	if _, ok := r.pending[8]; !ok {
		t.Fatal("unregistered status of pid 8 was not kept")
	}
}

func TestStartDiscardsStalePending(t *testing.T) {
	f := &fakeWait{}
	r := newReaper(f.wait)
	f.push(5, exitStatus(1)) // an old orphan with pid 5
	r.Reap()
	pid, ch, err := r.Start(func() (int, error) { return 5, nil }) // pid reused
	if err != nil || pid != 5 {
		t.Fatal(pid, err)
	}
	select {
	case e := <-ch:
		t.Fatalf("stale status delivered to new process: %+v", e)
	default:
	}
	f.push(5, exitStatus(4))
	r.Reap()
	if e := recv(t, ch); e.Status != 4 {
		t.Fatalf("got %+v, want 4", e)
	}
}

func TestPendingBounded(t *testing.T) {
	f := &fakeWait{}
	r := newReaper(f.wait)
	for i := 1; i <= maxPending+10; i++ {
		f.push(i, exitStatus(0))
	}
	r.Reap()
	if len(r.pending) != maxPending {
		t.Fatalf("pending %d, want %d", len(r.pending), maxPending)
	}
	if _, ok := r.pending[1]; ok {
		t.Fatal("oldest pending status was not dropped")
	}
}
