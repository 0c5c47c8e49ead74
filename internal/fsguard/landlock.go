package fsguard

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Access is what a Rule lets the confined process do beneath its path.
type Access uint64

const (
	// Read: read files, list directories.
	Read = Access(unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR)
	// Exec: Read, and execute files (QEMU, its libraries).
	Exec = Read | unix.LANDLOCK_ACCESS_FS_EXECUTE
	// Write: Read, and open files for writing; nothing created,
	// removed or truncated.
	Write = Read | unix.LANDLOCK_ACCESS_FS_WRITE_FILE
	// Own: everything: create, remove, rename, link, truncate.
	Own = Access(1<<63 - 1)
)

// Rule grants Access beneath Path (a directory) or to Path (a file).
type Rule struct {
	Path   string
	Access Access
}

// Policy is what a confined process may reach on the host's file
// systems: nothing but its Rules, however it names a file (an absolute
// path, "..", a descriptor, /proc/self/fd); no TCP port, bound or
// connected; no signal to, or /proc and ptrace access into, a process
// outside its own Landlock domain (every Confine makes a new one).
type Policy struct {
	Rules []Rule
	// Root, when set, is an empty directory on which the process's own
	// root is built (root.go): a mount namespace holding only Rules'
	// paths, Workdir and /proc, so that not even the owners and modes
	// of the host's other files, which Landlock does not govern, can be
	// reached. The directory stays empty on the host.
	Root string
	// Workdir is made, empty, in Root, for the process to start in.
	Workdir string
	// ReadOnlyOpens are files (absolute paths, as the process names
	// them) that the process opens for reading and writing, and is
	// given for reading only (reopen.go): a clone's template memory.
	// Their Rules should only read.
	ReadOnlyOpens []string
}

// kernelABI is LandlockABI; a test stands in a kernel without Landlock.
var kernelABI = LandlockABI

// MinLandlockABI is the first Landlock ABI Confine uses: ABI 1 refuses
// every rename between directories, and so the 9p server's.
const MinLandlockABI = 2

const fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
	unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE

// LandlockABI is the kernel's Landlock ABI version, 0 without Landlock.
// Confine uses Landlock from ABI 2 on (MinLandlockABI).
func LandlockABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0 // ENOSYS: not built; EOPNOTSUPP: not enabled at boot
	}
	return int(v)
}

// rulesetAttr is struct landlock_ruleset_attr up to the fields the
// policy uses; the size passed says which the kernel reads.
type rulesetAttr struct {
	fs, net, scoped uint64
}

// handled is what the ruleset governs at ABI abi: every file access but
// device ioctls (QEMU's devices are descriptors the host passes), TCP,
// and signals and abstract sockets out of the domain.
func handled(abi int) (attr rulesetAttr, size uintptr) {
	attr.fs = 1<<13 - 1 // ABI 1: execute … make_sym
	attr.fs |= unix.LANDLOCK_ACCESS_FS_REFER
	size = 8
	if abi >= 3 {
		attr.fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 4 {
		attr.net = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
		size = 16
	}
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL
		size = 24
	}
	return attr, size
}

// landlock restricts the calling thread (no_new_privs set) to p. It
// returns the ABI it used, or 0 where the kernel has no Landlock or only
// its first version (which refuses every rename between directories, and
// so 9p's), having restricted nothing.
func landlock(p Policy) (int, error) {
	abi := kernelABI()
	if abi < MinLandlockABI {
		return 0, nil
	}
	attr, size := handled(abi)
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return 0, fmt.Errorf("landlock: creating the ruleset: %w", errno)
	}
	defer unix.Close(int(rfd))
	for _, r := range p.Rules {
		if err := addRule(int(rfd), r, Access(attr.fs)); err != nil {
			return 0, err
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return 0, fmt.Errorf("landlock: restricting the thread: %w", errno)
	}
	return abi, nil
}

func addRule(rfd int, r Rule, handled Access) error {
	fd, err := unix.Open(r.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("landlock: %s: %w", r.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("landlock: %s: %w", r.Path, err)
	}
	access := r.Access & handled
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= fileRights
	}
	if access == 0 {
		return fmt.Errorf("landlock: %s: the rule grants nothing this kernel governs", r.Path)
	}
	attr := unix.LandlockPathBeneathAttr{Allowed_access: uint64(access), Parent_fd: int32(fd)}
	_, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rfd), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&attr)), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("landlock: rule for %s: %w", r.Path, errno)
	}
	return nil
}
