// Package fsguard keeps QEMU's 9p file server, which runs as root in
// passthrough mode and does on the host whatever guest root asks of its
// share, from making what would give a host process privileges: a
// seccomp filter, installed in QEMU's process before it runs, refuses
//
//   - mknod/mknodat of a block or character device (EPERM),
//   - chmod/fchmod/fchmodat/fchmodat2 and open/openat/creat with a mode
//     that has the setuid or setgid bit (EPERM),
//   - setxattr/lsetxattr/fsetxattr/setxattrat (EOPNOTSUPP): file
//     capabilities (security.capability) are an xattr, and a filter cannot
//     tell xattr names apart,
//   - io_uring_setup (ENOSYS; QEMU falls back to epoll), whose operations
//     seccomp would not see,
//
// and every syscall of another ABI (x32, i386). QEMU's own -sandbox
// filter stacks on top of it. docs/security.md says what it holds.
//
// Go cannot run code in a child between fork and exec, so the filter is
// installed on the one thread that forks QEMU (InstallThread): a child
// inherits its parent thread's filter and no_new_privs, and no other
// thread of the caller has them.
package fsguard

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// InstallThread sets no_new_privs and installs the filter on the calling
// thread only, which every process it starts afterwards inherits. The
// caller locks its goroutine to the thread for the life of the process
// (runtime.LockOSThread, never unlocked): Go then runs nothing else on
// it, and starts its own new threads from another thread, so the filter
// stays with that thread and its children.
func InstallThread() error {
	prog := program()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// prctl(PR_SET_NO_NEW_PRIVS, 1): required to install a filter without CAP_SYS_ADMIN, and harmless with it
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no_new_privs: %w", err)
	}
	// seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog): this thread only
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	return nil
}

// seccomp_data offsets (linux/seccomp.h): nr, arch, then the arguments
// as 64-bit values (the low half first, on little-endian x86-64).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// rule refuses one syscall: always (mask 0), when its argument arg has a
// bit of mask set, or (fileType) when arg&S_IFMT is a device type.
type rule struct {
	nr       uint32
	arg      uint32
	mask     uint32
	fileType bool
	errno    unix.Errno
}

const setid = unix.S_ISUID | unix.S_ISGID

var rules = []rule{
	{nr: unix.SYS_MKNOD, arg: 1, fileType: true, errno: unix.EPERM},
	{nr: unix.SYS_MKNODAT, arg: 2, fileType: true, errno: unix.EPERM},
	{nr: unix.SYS_CHMOD, arg: 1, mask: setid, errno: unix.EPERM},
	{nr: unix.SYS_FCHMOD, arg: 1, mask: setid, errno: unix.EPERM},
	{nr: unix.SYS_FCHMODAT, arg: 2, mask: setid, errno: unix.EPERM},
	{nr: 452 /* fchmodat2 */, arg: 2, mask: setid, errno: unix.EPERM},
	{nr: unix.SYS_OPEN, arg: 2, mask: setid, errno: unix.EPERM},
	{nr: unix.SYS_OPENAT, arg: 3, mask: setid, errno: unix.EPERM},
	{nr: unix.SYS_CREAT, arg: 1, mask: setid, errno: unix.EPERM},
	{nr: unix.SYS_SETXATTR, errno: unix.EOPNOTSUPP},
	{nr: unix.SYS_LSETXATTR, errno: unix.EOPNOTSUPP},
	{nr: unix.SYS_FSETXATTR, errno: unix.EOPNOTSUPP},
	{nr: 463 /* setxattrat */, errno: unix.EOPNOTSUPP},
	{nr: unix.SYS_IO_URING_SETUP, errno: unix.ENOSYS},
}

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

func deny(errno unix.Errno) unix.SockFilter {
	return stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ERRNO|uint32(errno))
}

var allow = stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_ALLOW)

// program is the filter: each rule is a block entered when the syscall
// number matches, ending in a return; a number that does not match skips
// the block.
func program() []unix.SockFilter {
	p := []unix.SockFilter{
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArch),
		jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.AUDIT_ARCH_X86_64, 1, 0),
		deny(unix.EPERM),
		stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offNr),
		// x32 syscalls are the x86-64 numbers with bit 30 set.
		jump(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, 0x40000000, 0, 1),
		deny(unix.EPERM),
	}
	for _, r := range rules {
		var block []unix.SockFilter
		switch {
		case r.fileType:
			block = []unix.SockFilter{
				stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArgs+8*r.arg),
				stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, unix.S_IFMT),
				jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.S_IFCHR, 2, 0),
				jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, unix.S_IFBLK, 1, 0),
				allow,
				deny(r.errno),
			}
		case r.mask != 0:
			block = []unix.SockFilter{
				stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, offArgs+8*r.arg),
				jump(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, r.mask, 1, 0),
				allow,
				deny(r.errno),
			}
		default:
			block = []unix.SockFilter{deny(r.errno)}
		}
		// The block clobbers the accumulator only on its own path, which
		// always returns; a non-matching number keeps nr loaded.
		p = append(p, jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, r.nr, 0, uint8(len(block))))
		p = append(p, block...)
	}
	return append(p, allow)
}
