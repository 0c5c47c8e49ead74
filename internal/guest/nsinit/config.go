// Package nsinit is the agent's container-side helper: the agent re-executes
// itself with Arg as its first argument, in the container's new namespaces
// (create mode) or after joining them (exec mode). The helper reads a Config
// from fd ConfigFD, builds the container's view of the world, resolves the
// command and reports on fd SyncFD: "ready" (create mode, then it waits for a
// byte on fd StartFD before exec) or an error. A successful exec closes
// SyncFD (it is close-on-exec), which the agent reads as EOF.
package nsinit

import (
	"encoding/json"
	"fmt"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Arg is the first argument that makes the agent binary act as the helper.
const Arg = "__hull_init"

// File descriptors the helper inherits besides stdio.
const (
	ConfigFD = 3
	SyncFD   = 4
	// StartFD in create mode; in exec mode it is the container's mount
	// namespace.
	StartFD   = 5
	MountNsFD = 5
)

// Modes.
const (
	ModeCreate = "create"
	ModeExec   = "exec"
)

// Config is what the agent tells the helper.
type Config struct {
	Mode        string `json:"mode"`
	ContainerID string `json:"container_id"`
	// Create mode only.
	Rootfs        string        `json:"rootfs,omitempty"`
	Readonly      bool          `json:"readonly,omitempty"`
	Mounts        []specs.Mount `json:"mounts,omitempty"`
	MaskedPaths   []string      `json:"masked_paths,omitempty"`
	ReadonlyPaths []string      `json:"readonly_paths,omitempty"`
	Hostname      string        `json:"hostname,omitempty"`
	// SetHostname is false when the container shares the guest's UTS
	// namespace and has no hostname of its own.
	SetHostname bool `json:"set_hostname,omitempty"`
	// Devices are created in the container (create mode), after /dev.
	Devices []Device `json:"devices,omitempty"`
	// Devpts is the container's devpts instance, mounted by the agent,
	// bound on /dev/pts ("": the helper mounts a new instance).
	Devpts string `json:"devpts,omitempty"`

	// Sysctl is written in create mode in the new namespaces (process.go).
	Sysctl map[string]string `json:"sysctl,omitempty"`
	// Seccomp is the container's filter, for its init and exec processes.
	Seccomp *specs.LinuxSeccomp `json:"seccomp,omitempty"`

	Process specs.Process `json:"process"`
}

// Device is a device node the helper creates in the container, with
// the guest's device number.
type Device struct {
	Path  string `json:"path"`
	Type  string `json:"type"` // "b" or "c"
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	Mode  uint32 `json:"mode"`
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
	// GuestName is the guest's name of a block device ("vdb"), for errors.
	GuestName string `json:"guest_name,omitempty"`
}

// Message is one line the helper writes on SyncFD.
type Message struct {
	Type string `json:"type"` // "ready" or "error"
	// For errors: Code is 126 or 127 for exec failures, 0 for other
	// setup failures.
	Code   int32  `json:"code,omitempty"`
	Path   string `json:"path,omitempty"`
	Reason string `json:"reason"`
}

// Message types.
const (
	MsgReady = "ready"
	MsgError = "error"
)

// Marshal encodes a message as one line.
func (m Message) Marshal() []byte {
	b, _ := json.Marshal(m)
	return append(b, '\n')
}

// ExecFailure is an exec error with its shell exit code.
type ExecFailure struct {
	Code   int32
	Path   string
	Reason string
}

func (e *ExecFailure) Error() string { return fmt.Sprintf("exec %q: %s", e.Path, e.Reason) }

var mountFlags = map[string]struct {
	clear bool
	flag  uintptr
}{
	"ro": {false, unix.MS_RDONLY},
	// "rro", recursively read-only: a volume reaches the guest as one 9p
	// tree (the host's submounts under it are not mounts here), made
	// recursively read-only on the host (internal/storage); in the guest
	// a read-only bind covers all of it.
	"rro":         {false, unix.MS_RDONLY},
	"rw":          {true, unix.MS_RDONLY},
	"nosuid":      {false, unix.MS_NOSUID},
	"suid":        {true, unix.MS_NOSUID},
	"nodev":       {false, unix.MS_NODEV},
	"dev":         {true, unix.MS_NODEV},
	"noexec":      {false, unix.MS_NOEXEC},
	"exec":        {true, unix.MS_NOEXEC},
	"sync":        {false, unix.MS_SYNCHRONOUS},
	"async":       {true, unix.MS_SYNCHRONOUS},
	"dirsync":     {false, unix.MS_DIRSYNC},
	"remount":     {false, unix.MS_REMOUNT},
	"mand":        {false, unix.MS_MANDLOCK},
	"nomand":      {true, unix.MS_MANDLOCK},
	"atime":       {true, unix.MS_NOATIME},
	"noatime":     {false, unix.MS_NOATIME},
	"diratime":    {true, unix.MS_NODIRATIME},
	"nodiratime":  {false, unix.MS_NODIRATIME},
	"bind":        {false, unix.MS_BIND},
	"rbind":       {false, unix.MS_BIND | unix.MS_REC},
	"relatime":    {false, unix.MS_RELATIME},
	"norelatime":  {true, unix.MS_RELATIME},
	"strictatime": {false, unix.MS_STRICTATIME},
}

var propagationFlags = map[string]uintptr{
	"private":     unix.MS_PRIVATE,
	"rprivate":    unix.MS_PRIVATE | unix.MS_REC,
	"shared":      unix.MS_SHARED,
	"rshared":     unix.MS_SHARED | unix.MS_REC,
	"slave":       unix.MS_SLAVE,
	"rslave":      unix.MS_SLAVE | unix.MS_REC,
	"unbindable":  unix.MS_UNBINDABLE,
	"runbindable": unix.MS_UNBINDABLE | unix.MS_REC,
}

// ParseMountOptions splits fstab-style options into mount flags,
// propagation flags and the filesystem's data string.
func ParseMountOptions(opts []string) (flags, propagation uintptr, data string) {
	var rest []string
	for _, o := range opts {
		if f, ok := mountFlags[o]; ok {
			if f.clear {
				flags &^= f.flag
			} else {
				flags |= f.flag
			}
			continue
		}
		if p, ok := propagationFlags[o]; ok {
			propagation |= p
			continue
		}
		rest = append(rest, o)
	}
	return flags, propagation, strings.Join(rest, ",")
}
