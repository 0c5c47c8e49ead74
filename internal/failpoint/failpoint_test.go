package failpoint

import (
	"errors"
	"testing"
	"time"
)

func TestParseAndCheck(t *testing.T) {
	s := Parse(" qemu-start , guest-panic@2s,,bad@x")
	err := s.Check(QEMUStart)
	if err == nil || err.Error() != "failpoint qemu-start: injected failure" || !errors.Is(err, ErrInjected) {
		t.Fatalf("Check(qemu-start) = %v", err)
	}
	if err := s.Check(AgentConnect); err != nil {
		t.Errorf("Check(agent-connect) = %v, want nil", err)
	}
	if d, ok := s.Armed(GuestPanic); !ok || d != 2*time.Second {
		t.Errorf("Armed(guest-panic) = %v, %v", d, ok)
	}
	if d, ok := s.Armed("bad"); !ok || d != 0 {
		t.Errorf("Armed(bad) = %v, %v; a bad delay counts as none", d, ok)
	}
	if err := (Set{}).Check(QEMUStart); err != nil {
		t.Errorf("zero Set: %v", err)
	}
}

func TestPrefixed(t *testing.T) {
	s := Parse("sandbox-guest-create,rootfs-mount")
	sb := s.Prefixed(SandboxPrefix)
	if err := sb.Check(GuestCreate); err == nil || err.Error() != "failpoint guest-create: injected failure" {
		t.Errorf("sandbox view Check(guest-create) = %v", err)
	}
	if err := sb.Check(RootfsMount); err != nil {
		t.Errorf("sandbox view Check(rootfs-mount) = %v, want nil", err)
	}
	if err := s.Check(GuestCreate); err != nil {
		t.Errorf("container view Check(guest-create) = %v, want nil", err)
	}
}

// FromAnnotations honours the annotation only with the build tag: run
// this test with and without -tags hull_failpoints.
func TestFromAnnotations(t *testing.T) {
	s := FromAnnotations(map[string]string{Annotation: StateCreate})
	err := s.Check(StateCreate)
	if Enabled && err == nil {
		t.Error("built with hull_failpoints: the annotation is ignored")
	}
	if !Enabled && err != nil {
		t.Errorf("built without hull_failpoints: the annotation armed %v", err)
	}
	if err := FromAnnotations(nil).Check(StateCreate); err != nil {
		t.Errorf("no annotation: %v", err)
	}
}
