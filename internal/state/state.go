// Package state is a sandbox's persisted record of the host resources it
// holds, and the one path that releases them.
//
// The rule every caller follows: record a resource (Handle.Record) before
// acquiring it, and release it only through Release. Because the record
// comes first, a crash at any point leaves a state file that names
// everything that may exist; because every releaser treats "already gone"
// as success, resources that were recorded but never acquired cost
// nothing. Normal delete, the rollback of a failed create, `shim delete`
// after a crash and `hull gc` all call Release with the same releasers.
//
// On disk, each sandbox has a directory <Root>/<id> (mode 0700) holding
// state.json (see SchemaVersion) and a lock file. The state file is
// replaced atomically (temp file, fsync, rename, fsync of the directory)
// while the lock is held, so a reader without the lock (Store.List, `hull
// ps`) always sees a complete file, and a failed save leaves the previous
// one in place.
package state

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"time"
)

// SchemaVersion is the version of state.json this package writes. A file
// with a newer version is refused rather than half understood.
const SchemaVersion = 1

// Kind says what sort of host resource a Resource is, and so which
// Releaser frees it.
type Kind string

// The kinds of resource. BuiltinReleasers handles KindProcess, KindMount,
// KindDir, KindFile, KindSocket and KindCgroup; the packages that own the
// others export theirs, and internal/releasers gathers them all.
const (
	KindProcess  Kind = "process"  // Pid + StartTime; Data["role"] names it ("qemu", "virtiofsd")
	KindMount    Kind = "mount"    // Path is the mount target
	KindDir      Kind = "dir"      // Path; removed with its contents, never through a mount
	KindFile     Kind = "file"     // Path
	KindSocket   Kind = "socket"   // Path of a unix socket
	KindTap      Kind = "tap"      // Netns + Link
	KindTCFilter Kind = "tcfilter" // Netns + Link (the link the filter hangs on), details in Data
	KindMacvtap  Kind = "macvtap"  // Netns + Link
	KindFD       Kind = "fd"       // a descriptor the shim holds (dies with it); details in Data
	KindCgroup   Kind = "cgroup"   // Path of a cgroup v2 directory
	KindLoopDev  Kind = "loopdev"  // Path of the loop device, backing file in Data
)

// Sandbox phases. Phase is informational (for `hull ps` and logs); what
// is released is decided by Resources alone.
const (
	PhaseCreating = "creating"
	PhaseRunning  = "running"
	PhaseStopping = "stopping"
	PhaseReleased = "released"
)

// RoleQEMU is Data["role"] of the QEMU process; `hull ps` shows its pid.
const RoleQEMU = "qemu"

// Resource is one host resource a sandbox holds (or is about to acquire).
type Resource struct {
	Kind Kind `json:"kind"`
	// Key is unique within a sandbox for its kind (usually the path, or
	// netns+link name). Recording the same kind and key again replaces
	// the entry in place.
	Key       string            `json:"key"`
	Path      string            `json:"path,omitempty"`       // dir, file, socket, mount target, cgroup path
	Pid       int               `json:"pid,omitempty"`        // process; 0 while recorded but not yet started
	StartTime uint64            `json:"start_time,omitempty"` // process: /proc/<pid>/stat field 22, so a reused pid is never killed
	Netns     string            `json:"netns,omitempty"`      // tap/tcfilter/macvtap: the netns path
	Link      string            `json:"link,omitempty"`       // tap/macvtap name, or the link a tc filter hangs on
	Data      map[string]string `json:"data,omitempty"`       // kind-specific extras
	Container string            `json:"container,omitempty"`  // owning container id, "" for the sandbox
}

// String names the resource the way errors and `hull gc` print it:
// "mount /run/hull/x/shared/c1/rootfs", "process qemu (pid 4242)".
func (r Resource) String() string {
	s := string(r.Kind) + " " + r.Key
	if r.Kind == KindProcess && r.Pid != 0 && r.Key != strconv.Itoa(r.Pid) {
		s += " (pid " + strconv.Itoa(r.Pid) + ")"
	}
	return s
}

// path is the filesystem path of a path-based resource: Path, or Key
// when Path is empty.
func (r Resource) path() string {
	if r.Path != "" {
		return r.Path
	}
	return r.Key
}

// pathKinds are the kinds whose releasers act on a filesystem path.
var pathKinds = map[Kind]bool{KindMount: true, KindDir: true, KindFile: true, KindSocket: true, KindCgroup: true}

// validate rejects records that a releaser could not act on safely.
func (r Resource) validate() error {
	if r.Kind == "" || r.Key == "" {
		return fmt.Errorf("resource %q %q: kind and key are required", r.Kind, r.Key)
	}
	if pathKinds[r.Kind] {
		if p := r.path(); !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("resource %s: path %q must be absolute, clean and not /", r, p)
		}
	}
	if r.Kind == KindProcess {
		if r.Pid < 0 {
			return fmt.Errorf("resource %s: negative pid %d", r, r.Pid)
		}
		if r.Pid > 0 && r.StartTime == 0 {
			// Without a start time a reused pid could be killed.
			return fmt.Errorf("resource %s: pid %d recorded without its start time", r, r.Pid)
		}
	}
	return nil
}

// Sandbox is the content of state.json.
type Sandbox struct {
	Version       int        `json:"version"`
	ID            string     `json:"id"`
	Namespace     string     `json:"namespace,omitempty"` // containerd namespace
	Bundle        string     `json:"bundle,omitempty"`
	ShimPid       int        `json:"shim_pid,omitempty"`        // the owner; Store.Create defaults it to the caller
	ShimStartTime uint64     `json:"shim_start_time,omitempty"` // the owner's /proc/<pid>/stat start time
	Created       time.Time  `json:"created"`
	Phase         string     `json:"phase"`     // PhaseCreating, PhaseRunning, PhaseStopping, PhaseReleased
	Resources     []Resource `json:"resources"` // in acquisition order
}

// clone returns a deep copy, so that callers never share a slice or map
// with a Handle.
func (s Sandbox) clone() Sandbox {
	c := s
	c.Resources = make([]Resource, len(s.Resources))
	for i, r := range s.Resources {
		r.Data = maps.Clone(r.Data)
		c.Resources[i] = r
	}
	return c
}

// find returns the index of the resource with kind and key, or -1.
func (s *Sandbox) find(kind Kind, key string) int {
	for i, r := range s.Resources {
		if r.Kind == kind && r.Key == key {
			return i
		}
	}
	return -1
}

// QEMUPid returns the pid of the process recorded with Data["role"] ==
// RoleQEMU and its start time, or zeros.
func (s *Sandbox) QEMUPid() (int, uint64) {
	for _, r := range s.Resources {
		if r.Kind == KindProcess && r.Data["role"] == RoleQEMU {
			return r.Pid, r.StartTime
		}
	}
	return 0, 0
}

// CountByKind returns how many resources of each kind are recorded.
func (s *Sandbox) CountByKind() map[Kind]int {
	n := map[Kind]int{}
	for _, r := range s.Resources {
		n[r.Kind]++
	}
	return n
}

// ErrNewerVersion is returned (wrapped in a *VersionError) for a state
// file written by a newer Hull.
var ErrNewerVersion = errors.New("state file has a newer schema version")

// VersionError names a state file whose schema version this Hull cannot
// read.
type VersionError struct {
	Path    string
	Version int
}

func (e *VersionError) Error() string {
	if e.Version > SchemaVersion {
		return fmt.Sprintf("%s: schema version %d is newer than this hull understands (%d)", e.Path, e.Version, SchemaVersion)
	}
	return fmt.Sprintf("%s: invalid schema version %d", e.Path, e.Version)
}

// Is makes errors.Is(err, ErrNewerVersion) true for newer versions.
func (e *VersionError) Is(target error) bool {
	return target == ErrNewerVersion && e.Version > SchemaVersion
}

// ValidID checks a sandbox or container id as containerd does
// ([A-Za-z0-9][A-Za-z0-9_.-]*, at most 76 characters) before it becomes a
// path component: it is then a single, safe one.
func ValidID(id string) error {
	if id == "" || len(id) > 76 {
		return fmt.Errorf("invalid id %q: must be 1 to 76 characters", id)
	}
	for i, c := range id {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("invalid id %q: must match [A-Za-z0-9][A-Za-z0-9_.-]*", id)
		}
	}
	return nil
}
