package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// data is struct seccomp_data.
type data struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

func (d data) bytes() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b[0:], d.nr)
	binary.LittleEndian.PutUint32(b[4:], d.arch)
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// run interprets the subset of classic BPF the compiler emits, with the
// kernel's seccomp checks (forward jumps only, aligned loads in bounds).
func run(prog []unix.SockFilter, d data) (uint32, error) {
	in := d.bytes()
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		f := prog[pc]
		switch f.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if f.K%4 != 0 || f.K+4 > uint32(len(in)) {
				return 0, fmt.Errorf("pc %d: bad load offset %d", pc, f.K)
			}
			acc = binary.LittleEndian.Uint32(in[f.K:])
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			acc &= f.K
		case unix.BPF_RET | unix.BPF_K:
			return f.K, nil
		case unix.BPF_JMP | unix.BPF_JA:
			pc += int(f.K)
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K,
			unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			var c bool
			switch f.Code &^ (unix.BPF_JMP | unix.BPF_K) {
			case unix.BPF_JEQ:
				c = acc == f.K
			case unix.BPF_JGT:
				c = acc > f.K
			case unix.BPF_JGE:
				c = acc >= f.K
			case unix.BPF_JSET:
				c = acc&f.K != 0
			}
			if c {
				pc += int(f.Jt)
			} else {
				pc += int(f.Jf)
			}
		default:
			return 0, fmt.Errorf("pc %d: unexpected opcode %#x", pc, f.Code)
		}
		if pc >= len(prog) {
			return 0, fmt.Errorf("pc %d: jump past the end", pc)
		}
	}
	return 0, fmt.Errorf("fell off the end")
}
