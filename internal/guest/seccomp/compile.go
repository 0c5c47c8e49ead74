// Package seccomp compiles an OCI seccomp profile (spec.linux.seccomp)
// into a classic BPF program and loads it, as libseccomp does for runc;
// the agent is static Go, so there is no libseccomp to call.
//
// The program checks the architecture (a foreign one gets the kill action,
// as libseccomp's default bad-arch action), then the syscall number, then
// the rule's argument comparisons on 64-bit values (two 32-bit words, as
// the kernel's struct seccomp_data holds them), and returns the rule's
// action or the default action.
package seccomp

import (
	"errors"
	"fmt"
	"sort"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Offsets in struct seccomp_data (include/uapi/linux/seccomp.h).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// x32SyscallBit is __X32_SYSCALL_BIT: x32 syscalls come with
// AUDIT_ARCH_X86_64 and this bit set in the number.
const x32SyscallBit = 0x40000000

// badArchAction is libseccomp's default for a foreign architecture
// (SCMP_ACT_KILL).
const badArchAction = unix.SECCOMP_RET_KILL_THREAD

// ErrUnsupported marks profile content the agent cannot enforce.
var ErrUnsupported = errors.New("not supported")

type arch struct {
	audit uint32
	table map[string]uint32
	bit   uint32 // or'ed into the numbers (x32)
	// word32: the arch's arguments are 32 bits wide; only the low word
	// is compared (as libseccomp does for 32-bit architectures).
	word32 bool
}

var (
	archX8664 = arch{audit: unix.AUDIT_ARCH_X86_64, table: syscallsX8664}
	archX86   = arch{audit: unix.AUDIT_ARCH_I386, table: syscallsX86, word32: true}
	archX32   = arch{audit: unix.AUDIT_ARCH_X86_64, table: syscallsX32, bit: x32SyscallBit}
)

// knownArchs are the SCMP_ARCH names libseccomp knows; only the x86 ones
// can run in the guest, the others are accepted and never match.
var knownArchs = map[specs.Arch]bool{
	specs.ArchX86: true, specs.ArchX86_64: true, specs.ArchX32: true,
	specs.ArchARM: true, specs.ArchAARCH64: true, specs.ArchMIPS: true, specs.ArchMIPS64: true,
	specs.ArchMIPS64N32: true, specs.ArchMIPSEL: true, specs.ArchMIPSEL64: true, specs.ArchMIPSEL64N32: true,
	specs.ArchPPC: true, specs.ArchPPC64: true, specs.ArchPPC64LE: true, specs.ArchS390: true,
	specs.ArchS390X: true, specs.ArchPARISC: true, specs.ArchPARISC64: true, specs.ArchRISCV64: true,
	specs.ArchLOONGARCH64: true, specs.ArchM68K: true, specs.ArchSH: true, specs.ArchSHEB: true,
}

// rule is one conditional or unconditional rule of one syscall.
type rule struct {
	action uint32
	conds  []specs.LinuxSeccompArg // all must match
}

// Action returns the kernel's SECCOMP_RET value of an OCI action.
// errnoRet defaults to EPERM for SCMP_ACT_ERRNO and SCMP_ACT_TRACE, as in
// runc.
func Action(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	data := uint32(unix.EPERM)
	if errnoRet != nil {
		data = uint32(*errnoRet) & unix.SECCOMP_RET_DATA
	}
	switch a {
	case specs.ActKill, specs.ActKillThread:
		return unix.SECCOMP_RET_KILL_THREAD, nil
	case specs.ActKillProcess:
		return unix.SECCOMP_RET_KILL_PROCESS, nil
	case specs.ActTrap:
		return unix.SECCOMP_RET_TRAP, nil
	case specs.ActErrno:
		return unix.SECCOMP_RET_ERRNO | data, nil
	case specs.ActTrace:
		return unix.SECCOMP_RET_TRACE | data, nil
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActLog:
		return unix.SECCOMP_RET_LOG, nil
	case specs.ActNotify:
		return 0, fmt.Errorf("seccomp action %q (user-space notification): %w", a, ErrUnsupported)
	}
	return 0, fmt.Errorf("unknown seccomp action %q", a)
}

// Flags returns the seccomp(2) flags of the profile.
func Flags(s *specs.LinuxSeccomp) (uint, error) {
	var flags uint
	for _, f := range s.Flags {
		switch f {
		case specs.LinuxSeccompFlagLog:
			flags |= unix.SECCOMP_FILTER_FLAG_LOG
		case specs.LinuxSeccompFlagSpecAllow:
			flags |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
		case "SECCOMP_FILTER_FLAG_TSYNC":
			flags |= unix.SECCOMP_FILTER_FLAG_TSYNC
		case specs.LinuxSeccompFlagWaitKillableRecv:
			return 0, fmt.Errorf("seccomp flag %q (user-space notification): %w", f, ErrUnsupported)
		default:
			return 0, fmt.Errorf("unknown seccomp flag %q", f)
		}
	}
	return flags, nil
}

// Compile turns the profile into a BPF program. Syscall names the
// architecture does not know are skipped, as libseccomp and runc do.
func Compile(s *specs.LinuxSeccomp) ([]unix.SockFilter, error) {
	if s.ListenerPath != "" {
		return nil, fmt.Errorf("seccomp listenerPath %q (user-space notification): %w", s.ListenerPath, ErrUnsupported)
	}
	def, err := Action(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("seccomp defaultAction: %w", err)
	}
	archs, err := selectArchs(s.Architectures)
	if err != nil {
		return nil, err
	}
	rules, err := collectRules(s, def)
	if err != nil {
		return nil, err
	}
	f := &filter{rules: rules, def: def, names: profileNames(s)}
	var a asm
	a.loadWord(offArch)
	labels := map[*arch]int{}
	for _, ar := range []*arch{&archX8664, &archX86} {
		if archs[ar] || (ar == &archX8664 && archs[&archX32]) {
			l := a.label()
			labels[ar] = l
			a.jump(unix.BPF_JEQ, ar.audit, next, skip1)
			a.jumpAlways(l)
		}
	}
	a.ret(badArchAction)
	if l, ok := labels[&archX8664]; ok {
		a.place(l)
		a.loadWord(offNr)
		// x32 numbers come with the x86_64 audit arch and the x32 bit.
		x32 := a.label()
		a.jump(unix.BPF_JGE, x32SyscallBit, next, skip1)
		a.jumpAlways(x32)
		if archs[&archX8664] {
			f.dispatch(&a, &archX8664)
		} else {
			a.ret(badArchAction)
		}
		a.place(x32)
		if archs[&archX32] {
			f.dispatch(&a, &archX32)
		} else {
			a.ret(badArchAction)
		}
	}
	if l, ok := labels[&archX86]; ok {
		a.place(l)
		a.loadWord(offNr)
		f.dispatch(&a, &archX86)
	}
	return a.assemble()
}

// selectArchs maps the profile's SCMP_ARCH names to the x86 ones the guest
// runs; none means the native one.
func selectArchs(names []specs.Arch) (map[*arch]bool, error) {
	archs := map[*arch]bool{}
	if len(names) == 0 {
		archs[&archX8664] = true
		return archs, nil
	}
	for _, n := range names {
		switch n {
		case specs.ArchX86_64:
			archs[&archX8664] = true
		case specs.ArchX86:
			archs[&archX86] = true
		case specs.ArchX32:
			archs[&archX32] = true
		default:
			if !knownArchs[n] {
				return nil, fmt.Errorf("unknown seccomp architecture %q", n)
			}
		}
	}
	return archs, nil
}

// namedRules are a syscall's rules in profile order.
type namedRules map[string][]rule

// collectRules groups the profile's rules by syscall name. A rule with two
// comparisons on the same argument becomes one rule per comparison (OR),
// as runc does; otherwise the comparisons are and-ed. Rules whose action is
// the default action are dropped, as runc does.
func collectRules(s *specs.LinuxSeccomp, def uint32) (namedRules, error) {
	rules := namedRules{}
	for i, sc := range s.Syscalls {
		act, err := Action(sc.Action, sc.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("seccomp syscalls[%d] (%v): %w", i, sc.Names, err)
		}
		if len(sc.Names) == 0 {
			return nil, fmt.Errorf("seccomp syscalls[%d]: no names", i)
		}
		seen := map[uint]bool{}
		split := false
		for _, c := range sc.Args {
			if c.Index >= 6 {
				return nil, fmt.Errorf("seccomp syscalls[%d] (%v): argument index %d out of range 0-5", i, sc.Names, c.Index)
			}
			if err := checkOp(c.Op); err != nil {
				return nil, fmt.Errorf("seccomp syscalls[%d] (%v): %w", i, sc.Names, err)
			}
			split = split || seen[c.Index]
			seen[c.Index] = true
		}
		if act == def {
			continue
		}
		var rs []rule
		if split {
			for _, c := range sc.Args {
				rs = append(rs, rule{action: act, conds: []specs.LinuxSeccompArg{c}})
			}
		} else {
			rs = []rule{{action: act, conds: sc.Args}}
		}
		for _, n := range sc.Names {
			rules[n] = append(rules[n], rs...)
		}
	}
	return rules, nil
}

func checkOp(op specs.LinuxSeccompOperator) error {
	switch op {
	case specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual, specs.OpEqualTo,
		specs.OpGreaterEqual, specs.OpGreaterThan, specs.OpMaskedEqual:
		return nil
	}
	return fmt.Errorf("unknown seccomp operator %q", op)
}

// filter is what the per-architecture code is made from.
type filter struct {
	rules namedRules
	def   uint32
	names []string // every syscall the profile names
}

func profileNames(s *specs.LinuxSeccomp) []string {
	var names []string
	for _, sc := range s.Syscalls {
		names = append(names, sc.Names...)
	}
	return names
}

// enosysAbove is the highest number of the syscalls the profile names on
// ar: a syscall above it is newer than the profile, and fails with
// ENOSYS instead of the default action, as runc's patched filters do
// (libcontainer/seccomp/patchbpf), so that a C library falls back to an
// older call. ok is false when the default action lets calls through.
func (f *filter) enosysAbove(ar *arch) (max uint32, ok bool) {
	if act := f.def & unix.SECCOMP_RET_ACTION_FULL; act == unix.SECCOMP_RET_ALLOW || act == unix.SECCOMP_RET_LOG || act == unix.SECCOMP_RET_TRACE {
		return 0, false
	}
	for _, n := range f.names {
		if nr, known := ar.table[n]; known && (!ok || nr|ar.bit > max) {
			max, ok = nr|ar.bit, true
		}
	}
	return max, ok
}

// dispatch emits the syscall number checks of one architecture (the
// accumulator holds the number), then one block per syscall with rules.
func (f *filter) dispatch(a *asm, ar *arch) {
	rules, def := f.rules, f.def
	type entry struct {
		nr    uint32
		rules []rule
	}
	var entries []entry
	for name, rs := range rules {
		nr, ok := ar.table[name]
		if !ok {
			continue // unknown to this arch: skipped like libseccomp
		}
		entries = append(entries, entry{nr | ar.bit, order(rs)})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].nr < entries[j].nr })
	blocks := make([]int, len(entries))
	for i, e := range entries {
		if len(e.rules) == 1 && len(e.rules[0].conds) == 0 {
			// jeq nr; ret action
			a.jump(unix.BPF_JEQ, e.nr, next, skip1)
			a.ret(e.rules[0].action)
			blocks[i] = -1
			continue
		}
		blocks[i] = a.label()
		a.jump(unix.BPF_JEQ, e.nr, next, skip1)
		a.jumpAlways(blocks[i])
	}
	if max, ok := f.enosysAbove(ar); ok {
		a.jump(unix.BPF_JGT, max, next, skip1)
		a.ret(unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS))
	}
	a.ret(def)
	for i, e := range entries {
		if blocks[i] < 0 {
			continue
		}
		a.place(blocks[i])
		emitRules(a, ar, e.rules, def)
	}
}

// order puts a syscall's conditional rules first, in profile order, then
// its first unconditional rule, which ends the list.
func order(rs []rule) []rule {
	var out []rule
	var uncond *rule
	for i := range rs {
		if len(rs[i].conds) > 0 {
			out = append(out, rs[i])
		} else if uncond == nil {
			uncond = &rs[i]
		}
	}
	if uncond != nil {
		out = append(out, *uncond)
	}
	return out
}

// emitRules emits one syscall's block: each rule's comparisons jump to the
// next rule when one fails; a rule that matches returns its action.
func emitRules(a *asm, ar *arch, rs []rule, def uint32) {
	for _, r := range rs {
		fail := a.label()
		for _, c := range r.conds {
			emitCond(a, ar, c, fail)
		}
		a.ret(r.action)
		a.place(fail)
		if len(r.conds) == 0 {
			return // unconditional: the rest is unreachable
		}
	}
	a.ret(def)
}

// emitCond emits one 64-bit comparison of argument c.Index: on a match it
// falls through, otherwise it jumps to fail. The high word (at +4 on
// little-endian x86) decides unless equal; then the low word decides.
func emitCond(a *asm, ar *arch, c specs.LinuxSeccompArg, fail int) {
	lo := uint32(offArgs + 8*c.Index)
	hi := lo + 4
	v, v2 := c.Value, c.ValueTwo
	ok := a.label()
	if ar.word32 {
		emitCond32(a, lo, c.Op, uint32(v), uint32(v2), ok, fail)
		a.place(ok)
		return
	}
	switch c.Op {
	case specs.OpEqualTo:
		a.loadWord(hi)
		a.jump(unix.BPF_JEQ, uint32(v>>32), next, fail)
		a.loadWord(lo)
		a.jump(unix.BPF_JEQ, uint32(v), next, fail)
	case specs.OpNotEqual:
		a.loadWord(hi)
		a.jump(unix.BPF_JEQ, uint32(v>>32), next, ok)
		a.loadWord(lo)
		a.jump(unix.BPF_JEQ, uint32(v), fail, ok)
	case specs.OpMaskedEqual: // (arg & Value) == ValueTwo
		a.loadWord(hi)
		a.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, uint32(v>>32))
		a.jump(unix.BPF_JEQ, uint32(v2>>32), next, fail)
		a.loadWord(lo)
		a.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, uint32(v))
		a.jump(unix.BPF_JEQ, uint32(v2), next, fail)
	case specs.OpGreaterThan, specs.OpGreaterEqual:
		loOp := uint16(unix.BPF_JGT)
		if c.Op == specs.OpGreaterEqual {
			loOp = unix.BPF_JGE
		}
		a.loadWord(hi)
		a.jump(unix.BPF_JGT, uint32(v>>32), ok, next)
		a.jump(unix.BPF_JEQ, uint32(v>>32), next, fail)
		a.loadWord(lo)
		a.jump(loOp, uint32(v), ok, fail)
	case specs.OpLessThan, specs.OpLessEqual:
		// arg < v is !(arg >= v); arg <= v is !(arg > v).
		loOp := uint16(unix.BPF_JGE)
		if c.Op == specs.OpLessEqual {
			loOp = unix.BPF_JGT
		}
		a.loadWord(hi)
		a.jump(unix.BPF_JGT, uint32(v>>32), fail, next)
		a.jump(unix.BPF_JEQ, uint32(v>>32), next, ok)
		a.loadWord(lo)
		a.jump(loOp, uint32(v), fail, ok)
	}
	a.place(ok)
}

// emitCond32 compares only the low word.
func emitCond32(a *asm, lo uint32, op specs.LinuxSeccompOperator, v, v2 uint32, ok, fail int) {
	a.loadWord(lo)
	switch op {
	case specs.OpEqualTo:
		a.jump(unix.BPF_JEQ, v, ok, fail)
	case specs.OpNotEqual:
		a.jump(unix.BPF_JEQ, v, fail, ok)
	case specs.OpMaskedEqual:
		a.stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, v)
		a.jump(unix.BPF_JEQ, v2, ok, fail)
	case specs.OpGreaterThan:
		a.jump(unix.BPF_JGT, v, ok, fail)
	case specs.OpGreaterEqual:
		a.jump(unix.BPF_JGE, v, ok, fail)
	case specs.OpLessThan:
		a.jump(unix.BPF_JGE, v, fail, ok)
	case specs.OpLessEqual:
		a.jump(unix.BPF_JGT, v, fail, ok)
	}
}
