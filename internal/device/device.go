// Package device resolves the host devices an OCI spec names
// (linux.devices) and pins each of them by file descriptor.
//
// The race it closes (docs/design.md, invariant 7): a device node named in a
// spec can be removed, or replaced by another device, between the moment
// the spec arrives and the moment the hypervisor opens it. Resolve opens
// every node as soon as the spec arrives, checks with fstat that the open
// file is the type and major:minor the spec names, and from then on only
// that descriptor is used: it is handed to QEMU (add-fd), never the path.
//
// Each descriptor is recorded in the sandbox's state (state.KindFD, per
// container) before it is opened, and closed by the one release path: the
// KindFD releaser registered here closes what this process holds under
// that record, first running the unplug that the hotplug registered with
// it (Attach). A descriptor of a process that is gone died with it, so in
// any other process (`shim delete`, `hull gc`) the releaser has nothing to
// do.
package device

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

// Errors a resolution fails with; callers branch on them with errors.Is.
var (
	// ErrNotFound: the node does not exist.
	ErrNotFound = errors.New("no such file")
	// ErrMismatch: the node is not the device the spec names.
	ErrMismatch = errors.New("not the device the spec names")
	// ErrUnsupported: a spec entry Hull cannot pass (a FIFO, a bad type).
	ErrUnsupported = errors.New("unsupported device")
)

// Device is one host device of a spec, open.
type Device struct {
	// Spec is the spec's entry (container path, type, numbers, mode,
	// owner).
	Spec specs.LinuxDevice
	// File is the open node, checked against Spec; the only handle on
	// the device from Resolve on.
	File *os.File
	// ReadOnly: the spec's device rules allow no write, so the node was
	// opened read-only and is attached read-only.
	ReadOnly bool
	// Key is the state record of File.
	Key string
}

// Name is how errors and logs name the device: "/dev/dm-102 (253:102)".
func Name(d specs.LinuxDevice) string {
	return fmt.Sprintf("%s (%d:%d)", d.Path, d.Major, d.Minor)
}

// Name names d the way errors do, by its host node.
func (d *Device) Name() string {
	s := d.Spec
	if d.File != nil {
		s.Path = d.File.Name()
	}
	return Name(s)
}

// Block says whether d is a block device (the kind that is hotplugged).
func (d *Device) Block() bool { return d.Spec.Type == "b" }

// Recorder records a resource before it is acquired (state.Handle).
type Recorder interface {
	Record(state.Resource) error
}

// Options say how Resolve treats a spec.
type Options struct {
	// Container owns the records.
	Container string
	// Recorder gets a KindFD record for each device before it is opened.
	Recorder Recorder
	// PrivilegedHostDevices is the config's runtime.privileged_host_devices:
	// false drops every device a privileged spec lists.
	PrivilegedHostDevices bool
}

// Set is the devices of one container.
type Set struct {
	Devices []*Device
	// Privileged: the spec is privileged and its devices were passed
	// (PrivilegedHostDevices); Skipped lists those that could not be.
	Privileged bool
	Skipped    []error
	// Dropped: a privileged spec whose devices were not passed.
	Dropped int
}

// Close closes every descriptor of the set (and forgets them). Release
// does the same through the state; Close is for callers without one.
func (s *Set) Close() {
	if s == nil {
		return
	}
	for _, d := range s.Devices {
		forget(d.Key)
	}
}

// Privileged says whether a spec is a privileged container's, as CRI
// and Docker build it: CAP_SYS_ADMIN in the bounding set and no masked
// paths.
func Privileged(spec *specs.Spec) bool {
	if spec == nil || spec.Process == nil || spec.Process.Capabilities == nil {
		return false
	}
	if !slices.Contains(spec.Process.Capabilities.Bounding, "CAP_SYS_ADMIN") {
		return false
	}
	return spec.Linux == nil || len(spec.Linux.MaskedPaths) == 0
}

// Resolve opens and checks every device in spec.Linux.Devices.
//
// For an ordinary container, a device that is missing or different fails
// the whole call with an error naming it, every descriptor already opened
// closed. For a privileged container, the spec lists every device of the
// host (containerd's privileged mode): they are passed only when
// o.PrivilegedHostDevices is set, and one that vanished or changed since
// containerd listed it is skipped (Set.Skipped), not fatal: the host's
// device list is a snapshot that another pod's teardown may change at
// any time (the seed report), and a privileged pod must not fail for it.
func Resolve(spec *specs.Spec, o Options) (_ *Set, retErr error) {
	set := &Set{}
	if spec == nil || spec.Linux == nil || len(spec.Linux.Devices) == 0 {
		return set, nil
	}
	if Privileged(spec) {
		if !o.PrivilegedHostDevices {
			set.Dropped = len(spec.Linux.Devices)
			return set, nil
		}
		set.Privileged = true
	}
	defer func() {
		if retErr != nil {
			set.Close()
		}
	}()
	var rules []specs.LinuxDeviceCgroup
	if spec.Linux.Resources != nil {
		rules = spec.Linux.Resources.Devices
	}
	seen := map[string]bool{}
	for _, sd := range spec.Linux.Devices {
		if seen[sd.Path] {
			continue // a privileged spec can repeat a path; the first wins
		}
		seen[sd.Path] = true
		ro := readOnly(sd, rules)
		key := fmt.Sprintf("device:%s:%s", o.Container, sd.Path)
		if o.Recorder != nil {
			if err := o.Recorder.Record(Resource(o.Container, key, sd)); err != nil {
				return nil, fmt.Errorf("recording host device %s: %w", Name(sd), err)
			}
		}
		f, err := OpenHost(sd, ro)
		if err != nil {
			if set.Privileged {
				set.Skipped = append(set.Skipped, err)
				continue
			}
			return nil, err
		}
		hold(key, f)
		set.Devices = append(set.Devices, &Device{Spec: sd, File: f, ReadOnly: ro, Key: key})
	}
	return set, nil
}

// Resource is the state record of a container's descriptor on a device.
func Resource(container, key string, d specs.LinuxDevice) state.Resource {
	return state.Resource{Kind: state.KindFD, Key: key, Container: container, Data: map[string]string{
		"device": d.Path, "type": d.Type, "major": fmt.Sprint(d.Major), "minor": fmt.Sprint(d.Minor),
	}}
}

// readOnly says whether the spec's device cgroup rules, applied in
// order, leave the device without write access (while allowing it).
func readOnly(d specs.LinuxDevice, rules []specs.LinuxDeviceCgroup) bool {
	access := ""
	matched := false
	for _, r := range rules {
		if r.Type != "" && r.Type != "a" && r.Type != d.Type {
			continue
		}
		if r.Major != nil && *r.Major != d.Major || r.Minor != nil && *r.Minor != d.Minor {
			continue
		}
		if r.Allow {
			access, matched = r.Access, true
			if r.Access == "" {
				access = "rwm"
			}
		} else {
			for _, c := range r.Access {
				access = strings.ReplaceAll(access, string(c), "")
			}
			if r.Access == "" {
				access = ""
			}
		}
	}
	return matched && strings.Contains(access, "r") && !strings.Contains(access, "w")
}

// SysDev is where the kernel lists devices by number.
var SysDev = "/sys/dev"

// HostPath finds the host's node of the device d names by number: an OCI
// spec carries the container's path and the device number, not the
// host's path (/sys/dev/block/253:102 says DEVNAME=dm-102).
func HostPath(d specs.LinuxDevice) (string, error) {
	kind := "char"
	if d.Type == "b" {
		kind = "block"
	}
	b, err := os.ReadFile(fmt.Sprintf("%s/%s/%d:%d/uevent", SysDev, kind, d.Major, d.Minor))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("host device %s: %w", Name(d), ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("host device %s: %w", Name(d), err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, ok := strings.CutPrefix(line, "DEVNAME="); ok && name != "" {
			return "/dev/" + name, nil
		}
	}
	return "", fmt.Errorf("host device %s: no node name in sysfs: %w", Name(d), ErrNotFound)
}

// OpenHost opens the host's node of the device d names (HostPath) and
// checks it (Open). Errors name the host path when it is known.
func OpenHost(d specs.LinuxDevice, readOnly bool) (*os.File, error) {
	if d.Type != "b" && d.Type != "c" && d.Type != "u" {
		return nil, fmt.Errorf("host device %s: type %q: %w", Name(d), d.Type, ErrUnsupported)
	}
	p, err := HostPath(d)
	if err != nil {
		return nil, err
	}
	hd := d
	hd.Path = p
	return Open(hd, readOnly)
}

// Open opens the node d names and checks that it is that device: its
// type ('b', or 'c'/'u') and major:minor. The check is made on the open
// descriptor (fstat), so the file returned is the device the spec names
// whatever happens to the path afterwards.
func Open(d specs.LinuxDevice, readOnly bool) (*os.File, error) {
	var want uint32
	switch d.Type {
	case "b":
		want = unix.S_IFBLK
	case "c", "u":
		want = unix.S_IFCHR
	default:
		return nil, fmt.Errorf("host device %s: type %q: %w", Name(d), d.Type, ErrUnsupported)
	}
	flags := unix.O_RDWR
	if readOnly {
		flags = unix.O_RDONLY
	}
	if want == unix.S_IFCHR {
		// A character device is never handed to the VM (the guest uses
		// its own device of that number), so it is pinned with O_PATH:
		// the driver's open is not called (opening /dev/watchdog arms
		// it; a tty could become a controlling terminal).
		flags = unix.O_PATH
	}
	fd, err := unix.Open(d.Path, flags|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("host device %s: %w", Name(d), ErrNotFound)
		}
		return nil, fmt.Errorf("host device %s: opening: %w", Name(d), err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("host device %s: fstat: %w", Name(d), err)
	}
	if st.Mode&unix.S_IFMT != want {
		unix.Close(fd)
		return nil, fmt.Errorf("host device %s is %s, spec says %s: %w", d.Path, typeName(st.Mode), typeName(want), ErrMismatch)
	}
	if maj, mnr := unix.Major(st.Rdev), unix.Minor(st.Rdev); int64(maj) != d.Major || int64(mnr) != d.Minor {
		unix.Close(fd)
		return nil, fmt.Errorf("host device %s is %d:%d, spec says %d:%d: %w", d.Path, maj, mnr, d.Major, d.Minor, ErrMismatch)
	}
	// Back to blocking mode for QEMU.
	if err := unix.SetNonblock(fd, false); want == unix.S_IFBLK && err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("host device %s: %w", Name(d), err)
	}
	return os.NewFile(uintptr(fd), d.Path), nil
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFREG:
		return "a regular file"
	default:
		return fmt.Sprintf("not a device (mode %#o)", mode&unix.S_IFMT)
	}
}

// Size is the size in bytes of the block device open as f.
func Size(f *os.File) (uint64, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var size uint64
	var ioErr error
	err = sc.Control(func(fd uintptr) {
		// blockdev --getsize64 DEVICE
		size, ioErr = unix.IoctlGetUint64(int(fd), unix.BLKGETSIZE64)
	})
	if err == nil {
		err = ioErr
	}
	return size, err
}

// The descriptors this process holds, by state key, with the unplug
// (hot-unplug from the VM) to run before each is closed.
var (
	// heldMu guards held.
	heldMu sync.Mutex
	held   = map[string]*holding{}
)

type holding struct {
	f      *os.File
	detach func(context.Context) error
}

func hold(key string, f *os.File) {
	heldMu.Lock()
	defer heldMu.Unlock()
	if old := held[key]; old != nil {
		old.f.Close()
	}
	held[key] = &holding{f: f}
}

// Attach registers how to detach d from the VM; the release path calls
// it before closing d's descriptor.
func Attach(d *Device, detach func(context.Context) error) {
	heldMu.Lock()
	defer heldMu.Unlock()
	if h := held[d.Key]; h != nil {
		h.detach = detach
	}
}

// Held is how many device descriptors this process holds (for tests).
func Held() int {
	heldMu.Lock()
	defer heldMu.Unlock()
	return len(held)
}

func forget(key string) {
	heldMu.Lock()
	h := held[key]
	delete(held, key)
	heldMu.Unlock()
	if h != nil {
		h.f.Close()
	}
}

// releaseFD is the KindFD releaser: detach from the VM (waiting for the
// guest to let go), then close. A record this process does not hold is
// already released (its descriptor died with the process that held it).
func releaseFD(ctx context.Context, r state.Resource) error {
	heldMu.Lock()
	h := held[r.Key]
	heldMu.Unlock()
	if h == nil {
		return nil
	}
	if h.detach != nil {
		if err := h.detach(ctx); err != nil {
			return fmt.Errorf("detaching host device %s: %w", r.Data["device"], err)
		}
	}
	forget(r.Key)
	return nil
}

// Releasers are this package's state releasers (internal/releasers
// gathers them with the others).
func Releasers() state.Releasers {
	return state.Releasers{state.KindFD: releaseFD, state.KindLoopDev: releaseLoop}
}
