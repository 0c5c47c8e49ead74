package shim

import (
	"strings"
	"testing"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestRefuseHostNetwork(t *testing.T) {
	withNetns := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"}}}}
	newNetns := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.NetworkNamespace}}}}
	hostNet := &specs.Spec{Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}}}}
	for _, s := range []*specs.Spec{withNetns, newNetns} {
		if err := refuseHostNetwork("sb", s); err != nil {
			t.Errorf("spec with a network namespace refused: %v", err)
		}
	}
	for _, s := range []*specs.Spec{hostNet, {}} {
		err := refuseHostNetwork("sb", s)
		if err == nil || !strings.Contains(err.Error(), "hostNetwork") || !errdefs.IsInvalidArgument(errdefs.FromGRPC(err)) {
			t.Errorf("host network spec: got %v, want an invalid-argument error naming hostNetwork", err)
		}
	}
}
