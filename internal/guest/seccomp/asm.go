package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// asm is a classic BPF assembler with forward labels. Conditional jumps
// reach at most 255 instructions ahead; the compiler keeps them inside one
// rule and uses ja (32-bit offset) for everything farther.
type asm struct {
	ins []inst
	pos []int // label -> instruction index, -1 until placed
}

// Jump targets besides labels: the following instruction, or the one
// after it.
const (
	next  = -1
	skip1 = -2
)

type inst struct {
	f      unix.SockFilter
	jt, jf int // labels for conditional jumps, or next
	ja     int // label for BPF_JA, or next
}

func (a *asm) label() int {
	a.pos = append(a.pos, -1)
	return len(a.pos) - 1
}

func (a *asm) place(l int) { a.pos[l] = len(a.ins) }

func (a *asm) stmt(code uint16, k uint32) {
	a.ins = append(a.ins, inst{f: unix.SockFilter{Code: code, K: k}, jt: next, jf: next, ja: next})
}

// jump is a conditional jump on the accumulator compared with k.
func (a *asm) jump(op uint16, k uint32, jt, jf int) {
	a.ins = append(a.ins, inst{f: unix.SockFilter{Code: unix.BPF_JMP | op | unix.BPF_K, K: k}, jt: jt, jf: jf, ja: next})
}

func (a *asm) jumpAlways(l int) {
	a.ins = append(a.ins, inst{f: unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JA}, jt: next, jf: next, ja: l})
}

// loadWord loads the 32-bit word at off of struct seccomp_data.
func (a *asm) loadWord(off uint32) { a.stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, off) }

func (a *asm) ret(v uint32) { a.stmt(unix.BPF_RET|unix.BPF_K, v) }

func (a *asm) offset(i, l int) (int, error) {
	switch l {
	case next:
		return 0, nil
	case skip1:
		return 1, nil
	}
	p := a.pos[l]
	if p < 0 {
		return 0, fmt.Errorf("label %d never placed", l)
	}
	d := p - i - 1
	if d < 0 {
		return 0, fmt.Errorf("backward jump from %d to %d", i, p)
	}
	return d, nil
}

// assemble resolves the labels.
func (a *asm) assemble() ([]unix.SockFilter, error) {
	out := make([]unix.SockFilter, len(a.ins))
	for i, in := range a.ins {
		f := in.f
		if in.f.Code == unix.BPF_JMP|unix.BPF_JA {
			d, err := a.offset(i, in.ja)
			if err != nil {
				return nil, err
			}
			f.K = uint32(d)
		} else if in.f.Code&0x07 == unix.BPF_JMP {
			for _, j := range []struct {
				l   int
				dst *uint8
			}{{in.jt, &f.Jt}, {in.jf, &f.Jf}} {
				d, err := a.offset(i, j.l)
				if err != nil {
					return nil, err
				}
				if d > 255 {
					return nil, fmt.Errorf("conditional jump at %d too far (%d)", i, d)
				}
				*j.dst = uint8(d)
			}
		}
		out[i] = f
	}
	if len(out) > maxInsns {
		return nil, fmt.Errorf("filter has %d instructions, more than the kernel's %d", len(out), maxInsns)
	}
	return out, nil
}

// maxInsns is BPF_MAXINSNS of include/uapi/linux/bpf_common.h.
const maxInsns = 4096
