package run

import (
	"encoding/json"
	"fmt"

	capability "github.com/containerd/containerd/pkg/cap"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// Guest-side names of the one-shot container.
const (
	containerID  = "run"
	rootfsTag    = "hullroot"
	guestRootfs  = "/run/hull/rootfs"
	defaultPath  = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	hostnameInVM = "hull"
)

// rootfsStorage is how the agent mounts the 9p share of --rootfs.
func rootfsStorage() *agent.Storage {
	return &agent.Storage{
		Source:     rootfsTag,
		Fstype:     "9p",
		Options:    []string{"trans=virtio", "version=9p2000.L", "msize=512000", "cache=mmap"},
		MountPoint: guestRootfs,
	}
}

// buildSpec is the OCI spec of the command. It has its own mount, UTS and
// IPC namespaces but shares the guest's PID namespace: the VM is the
// isolation boundary, and the command then keeps the default signal
// dispositions a PID 1 would lose (SIGTERM ends `sleep`, as with
// `docker run --init`).
func buildSpec(o *Options) ([]byte, error) {
	env := []string{defaultPath}
	if o.TTY {
		env = append(env, "TERM=xterm")
	}
	env = append(env, "HOSTNAME="+hostnameInVM)
	env = append(env, o.Env...)
	cwd := o.Cwd
	if cwd == "" {
		cwd = "/"
	}
	all := capability.Known()
	spec := specs.Spec{
		Version:  specs.Version,
		Hostname: hostnameInVM,
		Root:     &specs.Root{Path: guestRootfs},
		Process: &specs.Process{
			Terminal: o.TTY,
			Args:     o.Args,
			Env:      env,
			Cwd:      cwd,
			User:     specs.User{UID: 0, GID: 0},
			// The one command of the VM runs as root with every
			// capability: the VM is its wall.
			Capabilities: &specs.LinuxCapabilities{Bounding: all, Effective: all, Permitted: all},
			Rlimits:      []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1048576, Soft: 1048576}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.MountNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.IPCNamespace},
			},
		},
	}
	b, err := json.Marshal(&spec)
	if err != nil {
		return nil, fmt.Errorf("encoding the OCI spec: %w", err)
	}
	return b, nil
}
