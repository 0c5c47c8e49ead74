package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exitingVM is a VM whose process exits at once and is reaped (Done
// closed) after reapAfter.
type exitingVM struct{ done chan struct{} }

func newExitingVM(reapAfter time.Duration) *exitingVM {
	v := &exitingVM{done: make(chan struct{})}
	time.AfterFunc(reapAfter, func() { close(v.done) })
	return v
}

func (v *exitingVM) Pid() int                 { return 4242 }
func (v *exitingVM) Done() <-chan struct{}    { return v.done }
func (v *exitingVM) ExitError() error         { return errors.New("exit status 1") }
func (v *exitingVM) ConsoleTail(int) []string { return nil }

// A restored guest that dies at once can make QEMU exit before it is
// placed in the pod's cgroup: the write fails with "no such process"
// while QEMU is not yet reaped. That is a failed start (a clone's is
// retried as a boot; CI saw a pod fail instead), not a cgroup error.
func TestPlaceQEMUExitedBeforeReaped(t *testing.T) {
	gone := func(dirs []string, pid int) error {
		return fmt.Errorf("moving pid %d into cgroup %s: %w", pid, dirs[0], syscall.ESRCH)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := placeQEMU(ctx, newExitingVM(50*time.Millisecond), []string{"/sys/fs/cgroup/pod"}, gone)
	if !errors.Is(err, errQEMUStart) || !strings.Contains(err.Error(), "exited at once") {
		t.Errorf("placeQEMU = %v, want a failed start (errQEMUStart, QEMU exited at once)", err)
	}
}

// A join that fails while QEMU runs is the cgroup's failure, said as such
// at once.
func TestPlaceQEMUJoinFails(t *testing.T) {
	denied := func(dirs []string, pid int) error {
		return fmt.Errorf("moving pid %d into cgroup %s: %w", pid, dirs[0], syscall.EACCES)
	}
	v := newExitingVM(time.Hour)
	start := time.Now()
	err := placeQEMU(context.Background(), v, []string{"/sys/fs/cgroup/pod"}, denied)
	if errors.Is(err, errQEMUStart) || !errors.Is(err, syscall.EACCES) || !strings.Contains(err.Error(), "placing QEMU in the pod cgroup") {
		t.Errorf("placeQEMU = %v, want the cgroup error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("placeQEMU took %v with QEMU running", d)
	}
	if err := placeQEMU(context.Background(), v, nil, func([]string, int) error { return nil }); err != nil {
		t.Errorf("placeQEMU with a join that succeeds = %v", err)
	}
}
