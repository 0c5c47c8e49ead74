package container

import (
	"fmt"
	"log/slog"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/guest/caps"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/seccomp"
	"github.com/hull-runtime/hull/internal/guest/sysctl"
)

// validateProcessSecurity checks the capability names before anything is
// built; the helper applies them (internal/guest/nsinit/process.go).
func validateProcessSecurity(field string, p *specs.Process) error {
	if p.Capabilities == nil {
		return nil
	}
	if _, err := caps.ParseAll(p.Capabilities, caps.LastCap()); err != nil {
		return fmt.Errorf("%s.%w: %w", field, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validateLinuxSecurity checks the seccomp profile compiles and the
// sysctls are namespaced.
func validateLinuxSecurity(l *specs.Linux) error {
	if l == nil {
		return nil
	}
	if l.Seccomp != nil {
		if _, err := seccomp.New(l.Seccomp); err != nil {
			return fmt.Errorf("linux.seccomp: %w: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	if err := sysctl.Validate(l.Sysctl, l.Namespaces); err != nil {
		return fmt.Errorf("linux.sysctl: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// helperSysctls returns the sysctls the helper writes in the container's
// new namespaces. CRI gives the pod's sysctls to the sandbox container
// only; the pod's other containers share the guest's ipc and network
// namespaces (internal/storage/spec.go gives them the sandbox's by host
// path), so for the sandbox container the agent writes them in the
// guest's namespaces, where they see them, as runc's containers see the
// sandbox's.
func helperSysctls(s *specs.Spec) (map[string]string, error) {
	if s.Linux == nil || len(s.Linux.Sysctl) == 0 {
		return nil, nil
	}
	if s.Annotations[annotationContainerType] != "sandbox" {
		return s.Linux.Sysctl, nil
	}
	if err := sysctl.Write("/proc/sys", s.Linux.Sysctl); err != nil {
		return nil, fmt.Errorf("writing the pod's sysctls in the guest: %w", err)
	}
	return nil, nil
}

// seccompOf is the container's filter, which its exec processes get too.
func seccompOf(s *specs.Spec) *specs.LinuxSeccomp {
	if s.Linux == nil {
		return nil
	}
	return s.Linux.Seccomp
}

// logIgnoredLSM notes the security-module fields the guest does not
// enforce: its kernel has neither AppArmor nor SELinux.
func logIgnoredLSM(log *slog.Logger, p *specs.Process) {
	if p.ApparmorProfile != "" {
		log.Debug("ignoring process.apparmorProfile: the guest has no AppArmor", "profile", p.ApparmorProfile)
	}
	if p.SelinuxLabel != "" {
		log.Debug("ignoring process.selinuxLabel: the guest has no SELinux", "label", p.SelinuxLabel)
	}
}
