package sandbox

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The host leaves a sandbox container's rootfs unshared only where the
// agent runs Hull's pause instead of it: an agent that has the pause, the
// sandbox task, and a CRI sandbox's spec (a `ctr run` container is its own
// sandbox task, but the agent runs its command).
func TestRunsHullPause(t *testing.T) {
	cri := &specs.Spec{Annotations: map[string]string{AnnotationContainerType: ContainerTypeSandbox}}
	app := &specs.Spec{Annotations: map[string]string{AnnotationContainerType: "container"}}
	plain := &specs.Spec{}
	for _, tc := range []struct {
		agentPause, task bool
		spec             *specs.Spec
		want             bool
	}{
		{true, true, cri, true},
		{false, true, cri, false},
		{true, false, cri, false},
		{true, true, app, false},
		{true, true, plain, false},
		{true, true, nil, false},
	} {
		s := &Sandbox{hullPause: tc.agentPause}
		if got := s.runsHullPause(ContainerRequest{Pause: tc.task, Spec: tc.spec}); got != tc.want {
			t.Errorf("agent pause %v, sandbox task %v, spec %+v: %v, want %v", tc.agentPause, tc.task, tc.spec, got, tc.want)
		}
	}
}
