package container

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestPodPid(t *testing.T) {
	pid := func(path string) []specs.LinuxNamespace {
		return []specs.LinuxNamespace{{Type: specs.PIDNamespace, Path: path}}
	}
	cri := func(sid, typ string) map[string]string {
		return map[string]string{annotationSandboxID: sid, annotationContainerType: typ}
	}
	for _, tc := range []struct {
		name    string
		ann     map[string]string
		ns      []specs.LinuxNamespace
		sandbox string
		newNS   bool
	}{
		{"sandbox", cri("sb", "sandbox"), pid(""), "", true},
		{"sandbox hostPID", cri("sb", "sandbox"), nil, "", true},
		{"container mode", cri("sb", "container"), pid(""), "", true},
		{"pod mode", cri("sb", "container"), pid("/proc/7/ns/pid"), "sb", false},
		{"node mode", cri("sb", "container"), nil, "sb", false},
		{"hull run", nil, nil, "", false},
		{"ctr run", nil, pid(""), "", true},
	} {
		s := &specs.Spec{Annotations: tc.ann, Linux: &specs.Linux{Namespaces: tc.ns}}
		sb, n := podPid("c1", s)
		if sb != tc.sandbox || n != tc.newNS {
			t.Errorf("%s: podPid = %q, %v; want %q, %v", tc.name, sb, n, tc.sandbox, tc.newNS)
		}
	}
}
