// Package failpoint injects failures at named steps of sandbox and
// container creation, for the fault-injection tests only.
//
// A failpoint is armed by the OCI annotation io.hull.failpoint on the
// task's spec: a comma-separated list of step names, each optionally
// followed by "@<duration>" for the steps that act after a delay
// (io.hull.failpoint=guest-panic@2s). Only a binary built with the build
// tag hull_failpoints (`make shim-failpoints`) honours it; every other
// build ignores the annotation, so a production shim cannot be made to
// fail by a pod's metadata.
//
// An armed step fails with an error that names it,
// "failpoint <step>: injected failure", matching ErrInjected.
package failpoint

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Annotation arms failpoints (see the package documentation). containerd's
// CRI passes it to the shim only when the runtime handler lists it in
// pod_annotations (or container_annotations).
const Annotation = "io.hull.failpoint"

// ErrInjected is matched (errors.Is) by every injected failure.
var ErrInjected = errors.New("injected failure")

// The steps. Sandbox steps are checked once, while the sandbox task is
// created; the container steps are checked for every container, with the
// "sandbox-" prefix for the sandbox's own (pause) container, so that one
// pod annotation (CRI copies pod annotations to every container's spec)
// can target either. Each is checked right after its step succeeded, so
// the rollback has the step's resource to release.
const (
	StateCreate  = "state-create"  // state.json and the sandbox directory created
	VMDir        = "vm-dir"        // the shared directory created
	QEMUStart    = "qemu-start"    // QEMU started (and recorded with its pid)
	AgentConnect = "agent-connect" // the guest agent answered

	RootfsMount    = "rootfs-mount"    // <bundle>/rootfs mounted
	ShareRootfs    = "share-rootfs"    // the rootfs bound into shared/<id>/rootfs
	ShareMounts    = "share-mounts"    // the spec's bind mounts bound into shared/<id>/mounts
	GuestCreate    = "guest-create"    // the container created in the guest
	ContainerStart = "container-start" // checked before the container is started in the guest

	// GuestPanic is not a failure of a call: once the sandbox task has
	// started (after the optional delay), the shim makes the guest kernel
	// panic (an NMI with unknown_nmi_panic on the guest's command line),
	// as when the agent, the guest's PID 1, dies. QEMU then exits.
	GuestPanic = "guest-panic"

	// DeviceDelay is not a failure either: a container's host devices,
	// once opened and checked, wait for its delay before they are
	// hotplugged (io.hull.failpoint=device-delay@200ms), so that a test
	// can remove or detach them in that window.
	DeviceDelay = "device-delay"

	// AgentFatal is handed to the guest agent (kernel parameter
	// hull_failpoint=agent-fatal): the agent fails as a fatal error would,
	// logs the error to the guest console, and powers the guest off, so
	// RunPodSandbox fails and the error is in the shim's log.
	AgentFatal = "agent-fatal"
)

// SandboxPrefix prefixes the container steps of the sandbox container.
const SandboxPrefix = "sandbox-"

// Steps lists every step that fails a call, in the order creation passes
// them; the sandbox container's steps are SandboxPrefix + a container step.
// A CRI sandbox container the agent runs Hull's pause for shares nothing
// (docs/sandbox.md), and every guest image make builds has the pause, so
// its rootfs and mount steps are not listed: they are never reached.
var Steps = []string{
	StateCreate, VMDir, QEMUStart, AgentConnect,
	SandboxPrefix + GuestCreate, SandboxPrefix + ContainerStart,
	RootfsMount, ShareRootfs, ShareMounts, GuestCreate, ContainerStart,
}

// Set is the failpoints armed for one task. The zero value arms nothing.
type Set struct {
	steps map[string]time.Duration
}

// FromAnnotations returns the failpoints annotations arm: none unless the
// binary was built with the hull_failpoints tag.
func FromAnnotations(annotations map[string]string) Set {
	if !Enabled {
		return Set{}
	}
	return Parse(annotations[Annotation])
}

// Parse reads an annotation value, whatever the build; malformed entries
// are ignored (a bad delay counts as none).
func Parse(v string) Set {
	var s Set
	for _, f := range strings.Split(v, ",") {
		name, delay, _ := strings.Cut(strings.TrimSpace(f), "@")
		if name == "" {
			continue
		}
		d, _ := time.ParseDuration(delay)
		if s.steps == nil {
			s.steps = map[string]time.Duration{}
		}
		s.steps[name] = max(d, 0)
	}
	return s
}

// Armed says whether step is armed, and its delay.
func (s Set) Armed(step string) (time.Duration, bool) {
	d, ok := s.steps[step]
	return d, ok
}

// Check returns the injected failure of step when it is armed, else nil.
func (s Set) Check(step string) error {
	if _, ok := s.steps[step]; !ok {
		return nil
	}
	return fmt.Errorf("failpoint %s: %w", step, ErrInjected)
}

// Prefixed returns a Set whose Check(step) is s.Check(prefix + step): the
// sandbox container's view of the container steps.
func (s Set) Prefixed(prefix string) Set {
	if prefix == "" || len(s.steps) == 0 {
		return s
	}
	out := Set{steps: map[string]time.Duration{}}
	for k, d := range s.steps {
		if rest, ok := strings.CutPrefix(k, prefix); ok {
			out.steps[rest] = d
		}
	}
	return out
}
