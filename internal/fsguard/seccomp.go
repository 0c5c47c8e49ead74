package fsguard

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// installSeccomp installs the filter on the calling thread only, which
// has no_new_privs.
func installSeccomp() error {
	prog := program()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
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

// rules: for the 9p server, mknod/mknodat of a block or character device
// and chmod/fchmod/fchmodat/fchmodat2/open/openat/creat with a setuid or
// setgid mode fail with EPERM; setxattr and its variants with
// EOPNOTSUPP (file capabilities, security.capability, are an xattr, and
// a filter cannot tell xattr names apart); io_uring_setup with ENOSYS
// (QEMU falls back to epoll). Then each of refused, always.
var rules = append([]rule{
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
}, always(unix.EPERM, refused)...)

// refused are what a QEMU that fell to the guest would use against
// other processes or the host, and QEMU itself never calls (EPERM): a
// socket of its own (its sockets are the host's, passed; one it made
// could reach the host's services by path, which Landlock does not
// govern, or by network), another process's memory and descriptors,
// files by handle (past any root), mounts, namespaces and chroot, kernel code
// and programs, keys, the host's own controls, and truncate by path
// (Landlock before ABI 3 does not see it; QEMU truncates through
// descriptors).
var refused = []uint32{
	unix.SYS_SOCKET,
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV, unix.SYS_PIDFD_GETFD, unix.SYS_KCMP,
	unix.SYS_NAME_TO_HANDLE_AT, unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_OPEN_TREE, unix.SYS_MOVE_MOUNT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_UNSHARE, unix.SYS_SETNS, unix.SYS_CHROOT,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE, unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_ACCT, unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_SYSLOG, unix.SYS_IOPL, unix.SYS_IOPERM,
	unix.SYS_QUOTACTL, unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_TRUNCATE,
}

// always is a rule refusing each of nrs with errno.
func always(errno unix.Errno, nrs []uint32) []rule {
	r := make([]rule, len(nrs))
	for i, nr := range nrs {
		r[i] = rule{nr: nr, errno: errno}
	}
	return r
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
