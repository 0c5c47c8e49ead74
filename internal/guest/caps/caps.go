// Package caps parses the OCI capability sets and applies them to the
// calling thread, in runc's order: the bounding set is dropped before the
// user changes (PR_SET_KEEPCAPS keeps the permitted set across setuid),
// then effective, permitted and inheritable are set with capset, then the
// ambient set is raised.
package caps

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// names are the capabilities of include/uapi/linux/capability.h.
var names = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK",
	"CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE",
	"CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE",
	"CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
	"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

var byName = func() map[string]int {
	m := make(map[string]int, len(names))
	for i, n := range names {
		m[n] = i
	}
	return m
}()

// Set is a capability bit set.
type Set uint64

// Has reports whether cap is in the set.
func (s Set) Has(c int) bool { return s&(1<<c) != 0 }

// Names lists the set's capabilities.
func (s Set) Names() []string {
	var out []string
	for i, n := range names {
		if s.Has(i) {
			out = append(out, n)
		}
	}
	return out
}

// Sets are the five sets of a process.
type Sets struct {
	Bounding, Effective, Permitted, Inheritable, Ambient Set
}

// Parse turns names ("CAP_NET_ADMIN") into a set; an unknown name is an
// error naming it. Capabilities the running kernel lacks (above last) are
// left out, as runc does.
func Parse(field string, list []string, last int) (Set, error) {
	var s Set
	for _, n := range list {
		c, ok := byName[n]
		if !ok {
			return 0, fmt.Errorf("%s: unknown capability %q", field, n)
		}
		if c <= last {
			s |= 1 << c
		}
	}
	return s, nil
}

// ParseAll parses the five sets of the spec.
func ParseAll(c *specs.LinuxCapabilities, last int) (Sets, error) {
	var s Sets
	for _, f := range []struct {
		field string
		list  []string
		dst   *Set
	}{
		{"bounding", c.Bounding, &s.Bounding}, {"effective", c.Effective, &s.Effective},
		{"permitted", c.Permitted, &s.Permitted}, {"inheritable", c.Inheritable, &s.Inheritable},
		{"ambient", c.Ambient, &s.Ambient},
	} {
		v, err := Parse("capabilities."+f.field, f.list, last)
		if err != nil {
			return Sets{}, err
		}
		*f.dst = v
	}
	return s, nil
}

// LastCap is the kernel's highest capability number
// (/proc/sys/kernel/cap_last_cap), or the highest this package knows.
func LastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n < len(names) {
			return n
		}
	}
	return len(names) - 1
}

// DropBounding removes from the calling thread's bounding set every
// capability up to last that s does not hold (needs CAP_SETPCAP).
func DropBounding(s Set, last int) error {
	for c := 0; c <= last; c++ {
		if s.Has(c) {
			continue
		}
		// prctl(PR_CAPBSET_DROP, c)
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				continue // the kernel does not know it
			}
			return fmt.Errorf("dropping %s from the bounding set: %w", names[c], err)
		}
	}
	return nil
}

// SetKeepCaps sets PR_SET_KEEPCAPS: the permitted set survives a change
// from uid 0 to another uid.
func SetKeepCaps(on bool) error {
	v := uintptr(0)
	if on {
		v = 1
	}
	// prctl(PR_SET_KEEPCAPS, v)
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, v, 0, 0, 0); err != nil {
		return fmt.Errorf("setting keepcaps to %d: %w", v, err)
	}
	return nil
}

// Apply sets the effective, permitted and inheritable sets of the calling
// thread (capset), then its ambient set.
func Apply(s Sets) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		data[i] = unix.CapUserData{
			Effective:   uint32(s.Effective >> (32 * i)),
			Permitted:   uint32(s.Permitted >> (32 * i)),
			Inheritable: uint32(s.Inheritable >> (32 * i)),
		}
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("setting capabilities (effective %v, permitted %v, inheritable %v): %w",
			s.Effective.Names(), s.Permitted.Names(), s.Inheritable.Names(), err)
	}
	// prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the ambient set: %w", err)
	}
	for c := range names {
		if !s.Ambient.Has(c) {
			continue
		}
		// prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, c)
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c), 0, 0); err != nil {
			return fmt.Errorf("raising ambient %s (it must be permitted and inheritable): %w", names[c], err)
		}
	}
	return nil
}
