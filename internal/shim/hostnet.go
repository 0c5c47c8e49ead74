package shim

import (
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// refuseHostNetwork fails a sandbox whose spec shares the host's network
// namespace: containerd's CRI leaves the network namespace out of the
// sandbox spec for hostNetwork pods (NamespaceOption.Network=NODE), as
// `ctr run --net-host` does. A VM cannot join the host's network
// namespace: its workload would listen on the VM's interfaces, not the
// host's, so the pod would half work. Hull refuses it, as Kata does.
func refuseHostNetwork(id string, spec *specs.Spec) error {
	if spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace {
				return nil
			}
		}
	}
	return errdefs.ToGRPCf(errdefs.ErrInvalidArgument,
		"sandbox %s: hostNetwork (CRI NamespaceOption.Network=NODE, the host's network namespace) is not supported by hull: a VM cannot share the host's network namespace; run the pod with another runtime class", id)
}
