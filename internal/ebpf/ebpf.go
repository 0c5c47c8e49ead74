// Package ebpf is the little of the bpf(2) system call Hull uses: eBPF
// instructions and loading a program with the verifier's log in the
// error. It is neutral code, linked by both trees: the guest agent's
// device cgroup (internal/guest/cgroup) and the shim's port forwarding
// (internal/portforward) each write their program with it.
package ebpf

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Insn is one eBPF instruction (struct bpf_insn).
type Insn struct {
	Code     uint8
	Dst, Src uint8 // registers r0-r10
	Off      int16
	Imm      int32
}

// Encode lays prog out as the kernel reads it.
func Encode(prog []Insn) []byte {
	b := make([]byte, 8*len(prog))
	for i, in := range prog {
		b[8*i] = in.Code
		b[8*i+1] = in.Dst | in.Src<<4
		binary.NativeEndian.PutUint16(b[8*i+2:], uint16(in.Off))
		binary.NativeEndian.PutUint32(b[8*i+4:], uint32(in.Imm))
	}
	return b
}

// Syscall is bpf(cmd, attr, size), returning its result as a descriptor
// or count.
func Syscall(cmd int, attr unsafe.Pointer, size uintptr) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_BPF, uintptr(cmd), uintptr(attr), size)
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}

// progLoadAttr is the BPF_PROG_LOAD part of union bpf_attr.
type progLoadAttr struct {
	progType, insnCnt  uint32
	insns, license     uint64
	logLevel, logSize  uint32
	logBuf             uint64
	kernVersion, flags uint32
	name               [16]byte
	ifindex            uint32
	expectedAttachType uint32
}

// Load loads prog as a GPL program of progType for attachType, named
// name (at most 15 bytes), and returns its descriptor (close-on-exec).
// A refusal carries the verifier's log. The verifier runs without its log
// first, as libbpf's loads do: writing the log (a line per instruction
// and state) takes it longer than checking the program, a lot longer
// under TCG; only a refused program is loaded again to get the reason.
func Load(progType, attachType uint32, name string, prog []Insn) (int, error) {
	if len(prog) == 0 {
		return -1, fmt.Errorf("loading bpf program %s: no instructions", name)
	}
	fd, err := load(progType, attachType, name, prog, nil)
	if err == nil {
		return fd, nil
	}
	logBuf := make([]byte, 64<<10)
	if fd, err = load(progType, attachType, name, prog, logBuf); err == nil {
		return fd, nil // refused once, then loaded: a transient failure
	}
	return -1, fmt.Errorf("loading bpf program %s: %w (verifier: %s)", name, err, cString(logBuf))
}

// load is one BPF_PROG_LOAD, with the verifier's log in logBuf unless it
// is nil.
func load(progType, attachType uint32, name string, prog []Insn, logBuf []byte) (int, error) {
	code := Encode(prog)
	license := []byte("GPL\x00")
	attr := progLoadAttr{
		progType: progType, insnCnt: uint32(len(prog)),
		insns: uint64(uintptr(unsafe.Pointer(&code[0]))), license: uint64(uintptr(unsafe.Pointer(&license[0]))),
		expectedAttachType: attachType,
	}
	if len(logBuf) > 0 {
		attr.logLevel, attr.logSize, attr.logBuf = 1, uint32(len(logBuf)), uint64(uintptr(unsafe.Pointer(&logBuf[0])))
	}
	copy(attr.name[:15], name)
	// bpf(BPF_PROG_LOAD, {progType, insns, "GPL", attachType}). The
	// verifier gives up with EAGAIN when a signal is pending on the
	// thread (Go preempts goroutines with SIGURG; the agent takes SIGIO
	// and SIGCHLD): try again, as libbpf does.
	var fd int
	var err error
	for try := 0; try < progLoadTries; try++ {
		fd, err = Syscall(unix.BPF_PROG_LOAD, unsafe.Pointer(&attr), unsafe.Sizeof(attr))
		if err != unix.EAGAIN {
			break
		}
	}
	runtime.KeepAlive(code)
	runtime.KeepAlive(license)
	runtime.KeepAlive(logBuf)
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(fd)
	return fd, nil
}

// progLoadTries bounds Load's attempts while the verifier is interrupted.
const progLoadTries = 10

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// Opcodes Hull's programs use (BPF_CLASS | BPF_OP or BPF_MODE | BPF_SRC
// or BPF_SIZE); K takes the immediate, X the source register.
const (
	MovK    = unix.BPF_ALU64 | unix.BPF_MOV | unix.BPF_K
	MovX    = unix.BPF_ALU64 | unix.BPF_MOV | unix.BPF_X
	AddK    = unix.BPF_ALU64 | unix.BPF_ADD | unix.BPF_K
	AndK    = unix.BPF_ALU64 | unix.BPF_AND | unix.BPF_K
	RshK    = unix.BPF_ALU64 | unix.BPF_RSH | unix.BPF_K
	LdxW    = unix.BPF_LDX | unix.BPF_MEM | unix.BPF_W
	StW     = unix.BPF_ST | unix.BPF_MEM | unix.BPF_W
	LdImm64 = unix.BPF_LD | unix.BPF_IMM | unix.BPF_DW // two instructions
	JeqK    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	JneK    = unix.BPF_JMP | unix.BPF_JNE | unix.BPF_K
	Call    = unix.BPF_JMP | unix.BPF_CALL
	Exit    = unix.BPF_JMP | unix.BPF_EXIT
)
