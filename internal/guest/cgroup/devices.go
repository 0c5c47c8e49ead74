package cgroup

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"unsafe"

	"github.com/hull-runtime/hull/internal/ebpf"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DeviceRule is one device cgroup rule: Type 'a' (all), 'b' or 'c';
// Major, Minor -1 for any; Access a subset of "rwm".
type DeviceRule struct {
	Allow        bool
	Type         byte
	Major, Minor int64
	Access       string
}

func (r DeviceRule) String() string {
	num := func(n int64) string {
		if n < 0 {
			return "*"
		}
		return fmt.Sprint(n)
	}
	verb := "deny"
	if r.Allow {
		verb = "allow"
	}
	return fmt.Sprintf("%s %c %s:%s %s", verb, r.Type, num(r.Major), num(r.Minor), r.Access)
}

// AlwaysAllowed are the rules runc appends after the spec's
// (libcontainer/specconv's AllowedDevices): mknod of any node, the
// standard character devices, the container's ptys and /dev/net/tun.
var AlwaysAllowed = []DeviceRule{
	{true, 'c', -1, -1, "m"},
	{true, 'b', -1, -1, "m"},
	{true, 'c', 1, 3, "rwm"},    // /dev/null
	{true, 'c', 1, 8, "rwm"},    // /dev/random
	{true, 'c', 1, 7, "rwm"},    // /dev/full
	{true, 'c', 5, 0, "rwm"},    // /dev/tty
	{true, 'c', 1, 5, "rwm"},    // /dev/zero
	{true, 'c', 1, 9, "rwm"},    // /dev/urandom
	{true, 'c', 136, -1, "rwm"}, // /dev/pts/N
	{true, 'c', 5, 2, "rwm"},    // /dev/ptmx
	{true, 'c', 10, 200, "rwm"}, // /dev/net/tun
}

// SpecDeviceRules converts the spec's linux.resources.devices.
func SpecDeviceRules(in []specs.LinuxDeviceCgroup) ([]DeviceRule, error) {
	var out []DeviceRule
	for i, d := range in {
		r := DeviceRule{Allow: d.Allow, Type: 'a', Major: -1, Minor: -1, Access: d.Access}
		switch d.Type {
		case "", "a":
		case "b", "c":
			r.Type = d.Type[0]
		default:
			return nil, fmt.Errorf("linux.resources.devices[%d]: type %q is not a, b or c", i, d.Type)
		}
		if d.Major != nil {
			r.Major = *d.Major
		}
		if d.Minor != nil {
			r.Minor = *d.Minor
		}
		if r.Access == "" {
			r.Access = "rwm"
		}
		if _, err := accessBits(r.Access); err != nil {
			return nil, fmt.Errorf("linux.resources.devices[%d]: %w", i, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Access bits of struct bpf_cgroup_dev_ctx (BPF_DEVCG_ACC_*) and device
// types (BPF_DEVCG_DEV_*), from linux/bpf.h.
const (
	accMknod = 1
	accRead  = 2
	accWrite = 4
	devBlock = 1
	devChar  = 2
)

func accessBits(s string) (int32, error) {
	var a int32
	for _, c := range s {
		switch c {
		case 'm':
			a |= accMknod
		case 'r':
			a |= accRead
		case 'w':
			a |= accWrite
		default:
			return 0, fmt.Errorf("device access %q: %q is not r, w or m", s, c)
		}
	}
	return a, nil
}

// DeviceProgram compiles rules into a BPF_PROG_TYPE_CGROUP_DEVICE
// program with cgroup v1's semantics, as runc's devicefilter gives them:
// the last rule that matches an access decides it, nothing matching is
// denied. An allow rule matches when it grants every requested access, a
// deny rule when it refuses any of them.
func DeviceProgram(rules []DeviceRule) ([]ebpf.Insn, error) {
	// r2 = type, r3 = access, r4 = major, r5 = minor (ctx in r1)
	p := []ebpf.Insn{
		{Code: ebpf.LdxW, Dst: 2, Src: 1, Off: 0}, // access_type
		{Code: ebpf.MovX, Dst: 3, Src: 2},
		{Code: ebpf.AndK, Dst: 2, Imm: 0xffff},
		{Code: ebpf.RshK, Dst: 3, Imm: 16},
		{Code: ebpf.LdxW, Dst: 4, Src: 1, Off: 4},
		{Code: ebpf.LdxW, Dst: 5, Src: 1, Off: 8},
	}
	for i := len(rules) - 1; i >= 0; i-- {
		r := rules[i]
		acc, err := accessBits(r.Access)
		if err != nil {
			return nil, err
		}
		var block []ebpf.Insn // each jump's off is patched to "next rule"
		switch r.Type {
		case 'b':
			block = append(block, ebpf.Insn{Code: ebpf.JneK, Dst: 2, Imm: devBlock})
		case 'c':
			block = append(block, ebpf.Insn{Code: ebpf.JneK, Dst: 2, Imm: devChar})
		case 'a':
		default:
			return nil, fmt.Errorf("device rule %v: bad type", r)
		}
		block = append(block, ebpf.Insn{Code: ebpf.MovX, Dst: 1, Src: 3})
		if r.Allow {
			// requested & ^granted != 0: not all granted, no match
			block = append(block, ebpf.Insn{Code: ebpf.AndK, Dst: 1, Imm: ^acc & 7}, ebpf.Insn{Code: ebpf.JneK, Dst: 1, Imm: 0})
		} else {
			// requested & refused == 0: no match
			block = append(block, ebpf.Insn{Code: ebpf.AndK, Dst: 1, Imm: acc}, ebpf.Insn{Code: ebpf.JeqK, Dst: 1, Imm: 0})
		}
		if r.Major >= 0 {
			block = append(block, ebpf.Insn{Code: ebpf.JneK, Dst: 4, Imm: int32(r.Major)})
		}
		if r.Minor >= 0 {
			block = append(block, ebpf.Insn{Code: ebpf.JneK, Dst: 5, Imm: int32(r.Minor)})
		}
		verdict := int32(0)
		if r.Allow {
			verdict = 1
		}
		block = append(block, ebpf.Insn{Code: ebpf.MovK, Dst: 0, Imm: verdict}, ebpf.Insn{Code: ebpf.Exit})
		for j := range block {
			if block[j].Code == ebpf.JneK || block[j].Code == ebpf.JeqK {
				block[j].Off = int16(len(block) - j - 1)
			}
		}
		p = append(p, block...)
	}
	return append(p, ebpf.Insn{Code: ebpf.MovK, Dst: 0, Imm: 0}, ebpf.Insn{Code: ebpf.Exit}), nil
}

// progAttachAttr is the BPF_PROG_ATTACH part of union bpf_attr.
type progAttachAttr struct {
	targetFD, attachFD, attachType, attachFlags, replaceFD uint32
}

// SetDevices attaches the device program for rules to the cgroup,
// replacing the one attached before. Processes of the cgroup then open
// and mknod only the devices the rules allow.
func (c *Cgroup) SetDevices(rules []DeviceRule) error {
	prog, err := DeviceProgram(rules)
	if err != nil {
		return fmt.Errorf("device rules of cgroup %s: %w", c.Path, err)
	}
	fd, err := programs.load(prog)
	if err != nil {
		return fmt.Errorf("device program of cgroup %s: %w", c.Path, err)
	}
	defer unix.Close(fd)
	dir, err := os.OpenFile(c.Path, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening cgroup %s: %w", c.Path, err)
	}
	defer dir.Close()
	// bpf(BPF_PROG_ATTACH, {cgroup fd, prog fd, BPF_CGROUP_DEVICE, 0}):
	// without BPF_F_ALLOW_MULTI or _OVERRIDE the program replaces the
	// cgroup's previous one and no sub-cgroup can attach its own.
	at := progAttachAttr{targetFD: uint32(dir.Fd()), attachFD: uint32(fd), attachType: unix.BPF_CGROUP_DEVICE}
	if _, err := ebpf.Syscall(unix.BPF_PROG_ATTACH, unsafe.Pointer(&at), unsafe.Sizeof(at)); err != nil {
		return fmt.Errorf("attaching the device program to cgroup %s: %w", c.Path, err)
	}
	return nil
}

// DefaultDeviceRules are a container's rules when its spec has
// containerd's default list (deny everything) and no devices: what most
// containers of every pod, the pause container included, get.
func DefaultDeviceRules() []DeviceRule {
	return append([]DeviceRule{{Allow: false, Type: 'a', Major: -1, Minor: -1, Access: "rwm"}}, AlwaysAllowed...)
}

// PreloadDevices loads the program for rules ahead of the containers that
// will have them. The agent preloads DefaultDeviceRules as it starts: in a
// VM template that is before the snapshot, and every clone finds the
// program loaded.
func PreloadDevices(rules []DeviceRule) error {
	prog, err := DeviceProgram(rules)
	if err != nil {
		return err
	}
	fd, err := programs.load(prog)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// maxPrograms bounds the loaded device programs kept for reuse.
const maxPrograms = 8

// programs are the device programs loaded so far, by their code: a pod's
// containers mostly have the same rules, and each load runs the verifier
// (20-30 ms of a clone's pod start under TCG). One program can be
// attached to any number of cgroups.
var programs = &progCache{fds: map[string]int{}}

// progCache keeps up to maxPrograms loaded programs, the least recently
// used given up first.
type progCache struct {
	mu    sync.Mutex
	fds   map[string]int // code -> descriptor
	order []string       // codes, least recently used first
}

// load returns a descriptor of its own (the caller closes it) for a
// loaded program of code prog, loading it unless it is kept.
func (p *progCache) load(prog []ebpf.Insn) (int, error) {
	key := string(ebpf.Encode(prog))
	p.mu.Lock()
	defer p.mu.Unlock()
	fd, ok := p.fds[key]
	if !ok {
		var err error
		if fd, err = ebpf.Load(unix.BPF_PROG_TYPE_CGROUP_DEVICE, unix.BPF_CGROUP_DEVICE, "hull_devices", prog); err != nil {
			return -1, err
		}
		p.fds[key] = fd
		if len(p.order) == maxPrograms {
			unix.Close(p.fds[p.order[0]])
			delete(p.fds, p.order[0])
			p.order = p.order[1:]
		}
	} else {
		p.order = slices.DeleteFunc(p.order, func(k string) bool { return k == key })
	}
	p.order = append(p.order, key)
	// A duplicate: an eviction by another caller must not close, and
	// a later load reuse, the number this caller attaches.
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}
