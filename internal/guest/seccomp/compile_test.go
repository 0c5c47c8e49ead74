package seccomp

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

const (
	allow    = unix.SECCOMP_RET_ALLOW
	eperm    = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	enosys   = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	kill     = unix.SECCOMP_RET_KILL_THREAD
	archARM  = 0xc00000b7 // AUDIT_ARCH_AARCH64
	x8664    = unix.AUDIT_ARCH_X86_64
	i386     = unix.AUDIT_ARCH_I386
	cloneNS  = unix.CLONE_NEWNS | 17 // | SIGCHLD
	afVsock  = unix.AF_VSOCK
	afNetlnk = unix.AF_NETLINK
)

func loadProfile(t *testing.T, name string) *specs.LinuxSeccomp {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.LinuxSeccomp
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func mustCompile(t *testing.T, s *specs.LinuxSeccomp) []unix.SockFilter {
	t.Helper()
	prog, err := Compile(s)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return prog
}

func check(t *testing.T, prog []unix.SockFilter, name string, d data, want uint32) {
	t.Helper()
	got, err := run(prog, d)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if got != want {
		t.Errorf("%s: got %#x, want %#x", name, got, want)
	}
}

func TestContainerdDefaultProfile(t *testing.T) {
	prog := mustCompile(t, loadProfile(t, "testdata/containerd-default.json"))
	t.Logf("%d instructions", len(prog))
	x := func(name string) uint32 { return syscallsX8664[name] }
	for _, c := range []struct {
		name string
		d    data
		want uint32
	}{
		{"read", data{nr: x("read"), arch: x8664}, allow},
		{"execve", data{nr: x("execve"), arch: x8664}, allow},
		{"unshare", data{nr: x("unshare"), arch: x8664}, eperm},
		{"mount", data{nr: x("mount"), arch: x8664}, eperm},
		{"keyctl", data{nr: x("keyctl"), arch: x8664}, eperm},
		{"clone3 is ENOSYS (errnoRet)", data{nr: x("clone3"), arch: x8664}, enosys},
		{"clone fork", data{nr: x("clone"), arch: x8664, args: [6]uint64{17}}, allow},
		{"clone CLONE_NEWNS", data{nr: x("clone"), arch: x8664, args: [6]uint64{cloneNS}}, eperm},
		{"clone CLONE_NEWUSER", data{nr: x("clone"), arch: x8664, args: [6]uint64{unix.CLONE_NEWUSER}}, eperm},
		{"socket AF_INET", data{nr: x("socket"), arch: x8664, args: [6]uint64{unix.AF_INET}}, allow},
		{"socket AF_NETLINK", data{nr: x("socket"), arch: x8664, args: [6]uint64{afNetlnk}}, allow},
		{"socket AF_VSOCK", data{nr: x("socket"), arch: x8664, args: [6]uint64{afVsock}}, eperm},
		{"socket 41", data{nr: x("socket"), arch: x8664, args: [6]uint64{41}}, allow},
		{"personality 0", data{nr: x("personality"), arch: x8664}, allow},
		{"personality 0xffffffff", data{nr: x("personality"), arch: x8664, args: [6]uint64{0xffffffff}}, allow},
		{"personality 1", data{nr: x("personality"), arch: x8664, args: [6]uint64{1}}, eperm},
		{"personality high word", data{nr: x("personality"), arch: x8664, args: [6]uint64{1 << 32}}, eperm},
		{"newer than the profile: ENOSYS", data{nr: 999, arch: x8664}, enosys},
		{"kexec_load (not allowed)", data{nr: x("kexec_load"), arch: x8664}, eperm},
		{"i386 newer than the profile", data{nr: 999, arch: i386}, enosys},
		{"x32 newer than the profile", data{nr: 999 | x32SyscallBit, arch: x8664}, enosys},
		{"i386 read", data{nr: syscallsX86["read"], arch: i386}, allow},
		{"i386 unshare", data{nr: syscallsX86["unshare"], arch: i386}, eperm},
		{"i386 socket AF_VSOCK", data{nr: syscallsX86["socket"], arch: i386, args: [6]uint64{afVsock}}, eperm},
		{"x32 read", data{nr: syscallsX32["read"] | x32SyscallBit, arch: x8664}, allow},
		{"x32 unshare", data{nr: syscallsX32["unshare"] | x32SyscallBit, arch: x8664}, eperm},
		{"aarch64 read", data{nr: 63, arch: archARM}, kill},
	} {
		check(t, prog, c.name, c.d, c.want)
	}
}

// TestCompareOps checks each operator on 64-bit values against Go's
// comparison, on edge and random values.
func TestCompareOps(t *testing.T) {
	ref := map[specs.LinuxSeccompOperator]func(a, v, v2 uint64) bool{
		specs.OpEqualTo:      func(a, v, _ uint64) bool { return a == v },
		specs.OpNotEqual:     func(a, v, _ uint64) bool { return a != v },
		specs.OpLessThan:     func(a, v, _ uint64) bool { return a < v },
		specs.OpLessEqual:    func(a, v, _ uint64) bool { return a <= v },
		specs.OpGreaterThan:  func(a, v, _ uint64) bool { return a > v },
		specs.OpGreaterEqual: func(a, v, _ uint64) bool { return a >= v },
		specs.OpMaskedEqual:  func(a, v, v2 uint64) bool { return a&v == v2 },
	}
	edges := []uint64{0, 1, 2, 0xffffffff, 1 << 32, 1<<32 + 1, 0xfffffffe, 0x100000000 - 1, 1<<63 - 1, 1 << 63, ^uint64(0), ^uint64(0) - 1, 0x1234567800000000}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20; i++ {
		edges = append(edges, r.Uint64(), uint64(r.Uint32()), r.Uint64()&0xffffffff00000000)
	}
	nr := syscallsX8664["ioctl"]
	for op, f := range ref {
		for _, v := range edges {
			v2 := v & 0xff00ff00ff00ff00
			s := &specs.LinuxSeccomp{
				DefaultAction: specs.ActErrno,
				Architectures: []specs.Arch{specs.ArchX86_64},
				Syscalls: []specs.LinuxSyscall{{
					Names: []string{"ioctl"}, Action: specs.ActAllow,
					Args: []specs.LinuxSeccompArg{{Index: 3, Value: v, ValueTwo: v2, Op: op}},
				}},
			}
			prog := mustCompile(t, s)
			for _, a := range edges {
				want := uint32(eperm)
				if f(a, v, v2) {
					want = allow
				}
				d := data{nr: nr, arch: x8664}
				d.args[3] = a
				got, err := run(prog, d)
				if err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s arg %#x value %#x valueTwo %#x: got %#x, want %#x", op, a, v, v2, got, want)
				}
			}
		}
	}
}

func TestArgsAndOr(t *testing.T) {
	s := &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Syscalls: []specs.LinuxSyscall{
			// Different arguments: and-ed.
			{Names: []string{"kill"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: 1, Op: specs.OpEqualTo}, {Index: 1, Value: 9, Op: specs.OpEqualTo}}},
			// The same argument twice: or-ed, as runc does.
			{Names: []string{"setns"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{
				{Index: 1, Value: unix.CLONE_NEWNET, Op: specs.OpEqualTo}, {Index: 1, Value: unix.CLONE_NEWPID, Op: specs.OpEqualTo}}},
		},
	}
	prog := mustCompile(t, s)
	kill, setns := syscallsX8664["kill"], syscallsX8664["setns"]
	check(t, prog, "kill 1 9", data{nr: kill, arch: x8664, args: [6]uint64{1, 9}}, eperm)
	check(t, prog, "kill 1 15", data{nr: kill, arch: x8664, args: [6]uint64{1, 15}}, allow)
	check(t, prog, "kill 2 9", data{nr: kill, arch: x8664, args: [6]uint64{2, 9}}, allow)
	check(t, prog, "setns net", data{nr: setns, arch: x8664, args: [6]uint64{3, unix.CLONE_NEWNET}}, eperm)
	check(t, prog, "setns pid", data{nr: setns, arch: x8664, args: [6]uint64{3, unix.CLONE_NEWPID}}, eperm)
	check(t, prog, "setns uts", data{nr: setns, arch: x8664, args: [6]uint64{3, unix.CLONE_NEWUTS}}, allow)
	// No architectures: native only; x32 and i386 get the bad-arch action.
	check(t, prog, "x32 kill", data{nr: syscallsX32["kill"] | x32SyscallBit, arch: x8664}, kill32)
	check(t, prog, "i386 kill", data{nr: syscallsX86["kill"], arch: i386}, kill32)
}

const kill32 = unix.SECCOMP_RET_KILL_THREAD

func TestActionsAndErrno(t *testing.T) {
	errno := uint(unix.EACCES)
	defErrno := uint(unix.ENOSYS)
	s := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &defErrno,
		Architectures:   []specs.Arch{specs.ArchX86_64, specs.ArchAARCH64},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "no_such_syscall"}, Action: specs.ActAllow},
			{Names: []string{"write"}, Action: specs.ActErrno, ErrnoRet: &errno},
			{Names: []string{"getpid"}, Action: specs.ActKillProcess},
			{Names: []string{"gettid"}, Action: specs.ActTrap},
			{Names: []string{"getuid"}, Action: specs.ActLog},
			{Names: []string{"getgid"}, Action: specs.ActTrace},
			{Names: []string{"getppid"}, Action: specs.ActKill},
			// Same as the default: dropped.
			{Names: []string{"close"}, Action: specs.ActErrno, ErrnoRet: &defErrno},
		},
	}
	prog := mustCompile(t, s)
	n := func(s string) data { return data{nr: syscallsX8664[s], arch: x8664} }
	check(t, prog, "read", n("read"), allow)
	check(t, prog, "write", n("write"), unix.SECCOMP_RET_ERRNO|uint32(unix.EACCES))
	check(t, prog, "getpid", n("getpid"), unix.SECCOMP_RET_KILL_PROCESS)
	check(t, prog, "gettid", n("gettid"), unix.SECCOMP_RET_TRAP)
	check(t, prog, "getuid", n("getuid"), unix.SECCOMP_RET_LOG)
	check(t, prog, "getgid", n("getgid"), unix.SECCOMP_RET_TRACE|uint32(unix.EPERM))
	check(t, prog, "getppid", n("getppid"), unix.SECCOMP_RET_KILL_THREAD)
	check(t, prog, "close", n("close"), enosys)
	check(t, prog, "open", n("open"), enosys)

	// A default action that lets calls through: no ENOSYS above the
	// profile's syscalls.
	allowAll := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActErrno}}}
	check(t, mustCompile(t, allowAll), "allow default, 999", data{nr: 999, arch: x8664}, allow)
	errAll := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"write"}, Action: specs.ActAllow}}}
	check(t, mustCompile(t, errAll), "errno default, above write", data{nr: syscallsX8664["write"] + 1, arch: x8664}, enosys)
	check(t, mustCompile(t, errAll), "errno default, read", data{nr: syscallsX8664["read"], arch: x8664}, eperm)
}

func TestCompileErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		s    specs.LinuxSeccomp
		want string
	}{
		{"notify", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActNotify}}}, `"SCMP_ACT_NOTIFY"`},
		{"unknown action", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: "SCMP_ACT_BOGUS"}}}, `"SCMP_ACT_BOGUS"`},
		{"unknown default", specs.LinuxSeccomp{DefaultAction: "SCMP_ACT_NOPE"}, `"SCMP_ACT_NOPE"`},
		{"unknown arch", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{"SCMP_ARCH_Z80"}}, `"SCMP_ARCH_Z80"`},
		{"unknown op", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Op: "SCMP_CMP_XOR"}}}}}, `"SCMP_CMP_XOR"`},
		{"arg index", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Index: 6, Op: specs.OpEqualTo}}}}}, "index 6"},
		{"listener", specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/run/l.sock"}, "/run/l.sock"},
	} {
		_, err := New(&c.s)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error naming %s", c.name, err, c.want)
		}
	}
	if _, err := New(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActNotify}}}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("notify: %v is not ErrUnsupported", err)
	}
}

func TestFlags(t *testing.T) {
	f, err := Flags(&specs.LinuxSeccomp{Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_TSYNC", specs.LinuxSeccompFlagLog, specs.LinuxSeccompFlagSpecAllow}})
	if err != nil || f != unix.SECCOMP_FILTER_FLAG_TSYNC|unix.SECCOMP_FILTER_FLAG_LOG|unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW {
		t.Errorf("got %#x, %v", f, err)
	}
	if _, err := Flags(&specs.LinuxSeccomp{Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_BOGUS"}}); err == nil || !strings.Contains(err.Error(), "SECCOMP_FILTER_FLAG_BOGUS") {
		t.Errorf("unknown flag: %v", err)
	}
}

// TestLongProfile has more rules than a conditional jump reaches: the
// dispatch must still reach every syscall.
func TestLongProfile(t *testing.T) {
	s := &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Architectures: []specs.Arch{specs.ArchX86_64}}
	for name := range syscallsX8664 {
		s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{Names: []string{name}, Action: specs.ActErrno,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 7, Op: specs.OpEqualTo}}})
	}
	prog := mustCompile(t, s)
	for name, nr := range syscallsX8664 {
		check(t, prog, name+" 7", data{nr: nr, arch: x8664, args: [6]uint64{7}}, eperm)
		check(t, prog, name+" 8", data{nr: nr, arch: x8664, args: [6]uint64{8}}, allow)
	}
}

func readProfile(name string) (*specs.LinuxSeccomp, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	var s specs.LinuxSeccomp
	return &s, json.Unmarshal(b, &s)
}

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }
