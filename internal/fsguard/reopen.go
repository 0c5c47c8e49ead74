package fsguard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
)

// Opened read-only (Policy.ReadOnlyOpens). A clone's QEMU 7.2 opens its
// template's memory file O_RDWR although it only maps it privately
// (docs/templates.md "Limits"): given that descriptor, a QEMU the guest
// took over could write, fallocate or chmod the file every other clone
// of the template maps. Bound read-only in its root (Access Read), the
// file cannot be opened for writing at all, and QEMU would not start;
// so the confined thread also installs a second filter that turns each
// open(…, O_RDWR) and openat(AT_FDCWD, …, O_RDWR) into a seccomp user
// notification, which the confining process answers:
//
//   - for a path of ReadOnlyOpens, with a descriptor of that path in
//     the process's own root (its read-only bind), which the confining
//     process opens read-only through /proc/<pid>/root (walked without
//     following a symlink, internal/hostfs) and places in
//     the process as the call's result (SECCOMP_ADDFD_FLAG_SEND; before
//     Linux 5.14, placed and then given as the result, completeCall). A
//     private writable mapping of it needs no more; write, truncate and
//     fallocate (but a punch, below) fail with EBADF or EINVAL, fchmod
//     and fchown with EROFS; /proc/<pid>/maps shows the path as QEMU
//     named it.
//   - for any other path, by letting the call go on as made
//     (SECCOMP_USER_NOTIF_FLAG_CONTINUE): the kernel then checks it
//     against the root and Landlock as any other. That the path may
//     change between our reading it and the kernel's is why the answer
//     decides nothing a hostile process could gain from: at worst a
//     path of ReadOnlyOpens is opened as made, and fails on its
//     read-only bind.
//
// The filter also notifies fallocate(…, FALLOC_FL_PUNCH_HOLE…), for one
// reason: QEMU 7.2 discards guest RAM the guest freed (free page
// reporting, docs/templates.md) by punching a hole in its memory file and
// then dropping its own copy (madvise). A punch into a file answered
// read-only would fail (EBADF) and QEMU would keep the copy; so it
// succeeds without effect, and the clone's private copy is dropped while
// the template every clone maps stays whole. A punch into any other file
// goes on as made.
//
// The answers stop with the Confinement (Close, once the process is
// reaped); a call trapped after that fails with ENOSYS.

// Confinement is what Confine set up that outlives it: the answers to
// the opens of Policy.ReadOnlyOpens.
type Confinement struct {
	// LandlockABI is the Landlock ABI the thread used, 0 for none.
	LandlockABI int
	r           *reopener
}

// Close stops answering the opens (the confined processes must be
// gone) and closes what answered them. A nil Confinement is closed.
func (c *Confinement) Close() {
	if c != nil && c.r != nil {
		c.r.close()
	}
}

// reopener answers the notifications of one listener for paths, the
// Policy's ReadOnlyOpens.
type reopener struct {
	listener *os.File
	paths    map[string]bool
	served   chan struct{}
	// handed are the files of the descriptors placed read-only (only
	// the answering goroutine uses it).
	handed map[fileID]bool
}

// fileID names a file: its device and inode.
type fileID struct{ dev, ino uint64 }

// ReadOnlyOpens says whether this kernel can answer opens read-only:
// placing a descriptor in a notifying process (SECCOMP_IOCTL_NOTIF_ADDFD)
// came in Linux 5.9. Without it a clone's QEMU would be refused its
// template's memory; the caller boots its VMs instead.
func ReadOnlyOpens() error { return readOnlyOpensOn(kernelRelease()) }

func readOnlyOpensOn(release string) error {
	if !kernelAtLeast(release, 5, 9) {
		return fmt.Errorf("read-only opens need Linux 5.9 or later (SECCOMP_IOCTL_NOTIF_ADDFD); this kernel is %q", release)
	}
	return nil
}

// kernelRelease is uname -r, "" if it cannot be read.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// completesWithAddfd says whether this kernel places a descriptor and
// completes the call with it in one step (SECCOMP_ADDFD_FLAG_SEND, Linux
// 5.14); tests replace it to take the older kernels' way.
var completesWithAddfd = sync.OnceValue(func() bool { return kernelAtLeast(kernelRelease(), 5, 14) })

// kernelAtLeast says whether release ("6.1.0-28-amd64") is major.minor
// or later; false if it cannot be read.
func kernelAtLeast(release string, major, minor int) bool {
	var maj, min int
	if _, err := fmt.Sscanf(release, "%d.%d", &maj, &min); err != nil {
		return false
	}
	return maj > major || maj == major && min >= minor
}

// checkReadOnlyOpens refuses a policy whose ReadOnlyOpens would not be
// read-only: each needs the root, where only a rule that does not
// write binds it read-only, and a kernel that can answer them.
func checkReadOnlyOpens(p Policy) error {
	if len(p.ReadOnlyOpens) > 0 {
		if err := ReadOnlyOpens(); err != nil {
			return err
		}
	}
	for _, path := range p.ReadOnlyOpens {
		if p.Root == "" {
			return fmt.Errorf("read-only open of %s: the policy has no root of its own to bind it read-only in", path)
		}
		if !slices.ContainsFunc(p.Rules, func(r Rule) bool { return r.Path == path && r.Access != 0 && !writes(r.Access) }) {
			return fmt.Errorf("read-only open of %s: the policy has no rule that only reads it", path)
		}
		if slices.ContainsFunc(p.Rules, func(r Rule) bool { return writes(r.Access) && beneath(path, r.Path) }) {
			return fmt.Errorf("read-only open of %s: a rule writes beneath it", path)
		}
	}
	return nil
}

// listen installs the notifying filter on the calling thread, which
// has no_new_privs, and answers the opens of paths from another
// goroutine.
func listen(paths []string) (*reopener, error) {
	r := &reopener{paths: map[string]bool{}, served: make(chan struct{}), handed: map[fileID]bool{}}
	for _, p := range paths {
		r.paths[p] = true
	}
	return r, r.install()
}

func (r *reopener) install() error {
	prog := notifyProgram()
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	// seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog): this thread only
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER,
		uintptr(unsafe.Pointer(&fprog)))
	if errno != 0 {
		return fmt.Errorf("installing the read-only-open filter: %w", errno)
	}
	// The listener is polled by Go's netpoller: no thread waits on it.
	if err := unix.SetNonblock(int(fd), true); err != nil {
		unix.Close(int(fd))
		return fmt.Errorf("read-only-open listener: %w", err)
	}
	r.listener = os.NewFile(fd, "seccomp-listener")
	go r.serve()
	return nil
}

// serve answers notifications until every process under the filter is
// gone (POLLHUP) or the listener is closed. Should it end otherwise, it
// closes the listener: the calls it would not answer fail (ENOSYS)
// instead of waiting for ever.
func (r *reopener) serve() {
	defer close(r.served)
	defer r.listener.Close()
	rc, err := r.listener.SyscallConn()
	if err != nil {
		return
	}
	rc.Read(func(fd uintptr) bool {
		for {
			// RECV blocks whatever the descriptor's flags: ask first.
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 0)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case err != nil:
				return true
			case n == 0:
				return false // wait for the next notification
			case pfd[0].Revents&unix.POLLIN == 0:
				return true // no process left under the filter
			}
			r.answer(int(fd))
		}
	})
}

func (r *reopener) close() {
	if r.listener != nil {
		r.listener.Close()
		<-r.served
	}
}

// struct seccomp_notif, seccomp_notif_resp and seccomp_notif_addfd
// (linux/seccomp.h).
type notif struct {
	id    uint64
	pid   uint32
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

type notifResp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

type notifAddfd struct {
	id         uint64
	flags      uint32
	srcfd      uint32
	newfd      uint32
	newfdFlags uint32
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	_, err := ioctlValue(fd, req, arg)
	return err
}

// ioctlValue is ioctl with the call's result.
func ioctlValue(fd int, req uint, arg unsafe.Pointer) (int, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// notifIDValidWrongDir is SECCOMP_IOCTL_NOTIF_ID_VALID as the kernel
// first numbered it (_IOR, fixed to _IOW by commit 47e33c05f9f0): a
// kernel that refuses the fixed number (EINVAL) is asked with this one,
// which later kernels still take.
const notifIDValidWrongDir = 0x80082102

// idValid says whether notification id is still pending.
func idValid(listener int, id uint64) error {
	err := ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id))
	if errors.Is(err, unix.EINVAL) {
		err = ioctl(listener, notifIDValidWrongDir, unsafe.Pointer(&id))
	}
	return err
}

// answer receives one notification and answers it: a path of
// ReadOnlyOpens with its descriptor, or the error that made one
// impossible; a punch into a file handed out so, with success; any
// other call, or one whose path or file cannot be read, by letting it go
// on as made. A process gone meanwhile gets no answer.
func (r *reopener) answer(listener int) {
	var n notif // RECV wants it zeroed
	if err := ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&n)); err != nil {
		return
	}
	if n.nr == unix.SYS_FALLOCATE {
		resp := r.punch(listener, n)
		ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
		return
	}
	pathArg, flagsArg := n.args[1], n.args[2] // openat(dirfd, path, flags, mode)
	if n.nr == unix.SYS_OPEN {
		pathArg, flagsArg = n.args[0], n.args[1] // open(path, flags, mode)
	}
	resp := notifResp{id: n.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	if p, err := openProcess(listener, n); err == nil {
		defer p.close()
		if path := p.path(pathArg); r.paths[path] {
			errno := r.substitute(p, listener, n.id, path, flagsArg)
			if errno == 0 {
				return
			}
			// the open fails as it would have for the process
			resp = notifResp{id: n.id, error: -int32(errno)}
		}
	}
	ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
}

// process is the notifying process's memory and root, opened once the
// notification is known to be still pending, so that they are that
// process's and not a later one's with its pid.
type process struct {
	mem  *os.File
	root int
}

func openProcess(listener int, n notif) (*process, error) {
	dir := "/proc/" + strconv.Itoa(int(n.pid))
	mem, err := os.Open(dir + "/mem")
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(dir+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		mem.Close()
		return nil, err
	}
	p := &process{mem: mem, root: root}
	if err := idValid(listener, n.id); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *process) close() {
	p.mem.Close()
	unix.Close(p.root)
}

// path reads the NUL-terminated path at addr in the process's memory,
// "" if it cannot.
func (p *process) path(addr uint64) string {
	var path []byte
	for len(path) <= unix.PathMax {
		// to the end of addr's page, which is mapped if addr is
		chunk := make([]byte, 4096-addr%4096)
		k, err := p.mem.ReadAt(chunk, int64(addr))
		if i := bytes.IndexByte(chunk[:k], 0); i >= 0 {
			return string(append(path, chunk[:i]...))
		}
		if err != nil {
			return ""
		}
		path = append(path, chunk...)
		addr += uint64(len(chunk))
	}
	return ""
}

// substitute completes call id with a read-only descriptor of path in
// the process's root, close-on-exec if the call asked. The path is
// walked there as the root was built (internal/hostfs: no symlink,
// through the host's top-level ones as they lead, throughTopLevel). It
// returns the errno the call is to fail with otherwise.
func (r *reopener) substitute(p *process, listener int, id uint64, path string, flags uint64) unix.Errno {
	rel := strings.TrimPrefix(filepath.Clean(throughTopLevel(path)), "/")
	fd, err := hostfs.OpenAt(p.root, rel, unix.O_RDONLY, false)
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(fd)
	// Its bind is read-only (checkReadOnlyOpens); were it not, fchmod
	// through the descriptor would reach the host's file.
	var sfs unix.Statfs_t
	var st unix.Stat_t
	if err := unix.Fstatfs(fd, &sfs); err != nil || sfs.Flags&unix.ST_RDONLY == 0 || unix.Fstat(fd, &st) != nil {
		return unix.EACCES
	}
	r.handed[fileID{st.Dev, st.Ino}] = true
	add := notifAddfd{id: id, srcfd: uint32(fd)}
	if flags&unix.O_CLOEXEC != 0 {
		add.newfdFlags = unix.O_CLOEXEC
	}
	if completesWithAddfd() {
		add.flags = unix.SECCOMP_ADDFD_FLAG_SEND
		return errnoOf(ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_ADDFD, unsafe.Pointer(&add)))
	}
	return completeCall(listener, &add)
}

// completeCall places add's descriptor in the process and then completes
// the call with its number, the way before SECCOMP_ADDFD_FLAG_SEND. A
// process the second step no longer reaches (killed, or its call
// interrupted and made again) keeps a read-only descriptor it does not
// know of: nothing it could not open itself, as its Landlock rule and
// its root's bind let it read the file. It returns the errno the call is
// to fail with if the descriptor could not be placed.
func completeCall(listener int, add *notifAddfd) unix.Errno {
	newfd, err := ioctlValue(listener, unix.SECCOMP_IOCTL_NOTIF_ADDFD, unsafe.Pointer(add))
	if err != nil {
		return errnoOf(err)
	}
	resp := notifResp{id: add.id, val: int64(newfd)}
	ioctl(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	return 0
}

// punch answers fallocate(fd, mode with FALLOC_FL_PUNCH_HOLE, …): with
// success and no effect if fd is a file handed out read-only, otherwise
// by letting it go on. The file is read through /proc/<pid>/fd, and the
// notification checked still pending after, so that it is that
// process's descriptor; one the process changes meanwhile is judged by
// the kernel as made (a descriptor handed out read-only cannot punch).
func (r *reopener) punch(listener int, n notif) notifResp {
	goOn := notifResp{id: n.id, flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
	var st unix.Stat_t
	fd := strconv.Itoa(int(int32(n.args[0])))
	if err := unix.Stat("/proc/"+strconv.Itoa(int(n.pid))+"/fd/"+fd, &st); err != nil || idValid(listener, n.id) != nil {
		return goOn
	}
	if r.handed[fileID{st.Dev, st.Ino}] {
		return notifResp{id: n.id}
	}
	return goOn
}

// errnoOf is err's errno, 0 for none, EACCES for an error without one.
func errnoOf(err error) unix.Errno {
	var errno unix.Errno
	if err == nil || errors.As(err, &errno) {
		return errno
	}
	return unix.EACCES
}

// notifyProgram notifies open(path, O_RDWR…), openat(AT_FDCWD, path,
// O_RDWR…) and fallocate(fd, FALLOC_FL_PUNCH_HOLE…), and allows
// everything else (the first filter refuses the other ABIs).
func notifyProgram() []unix.SockFilter {
	const atFDCWD = uint32(0xffffff9c) // AT_FDCWD, -100, as the low half of the argument
	notify := stmt(unix.BPF_RET|unix.BPF_K, unix.SECCOMP_RET_USER_NOTIF)
	ld := func(off uint32) unix.SockFilter { return stmt(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, off) }
	jeq := func(k uint32, jt, jf uint8) unix.SockFilter {
		return jump(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, k, jt, jf)
	}
	accmode := stmt(unix.BPF_ALU|unix.BPF_AND|unix.BPF_K, unix.O_ACCMODE)
	return []unix.SockFilter{
		ld(offArch),
		jeq(unix.AUDIT_ARCH_X86_64, 1, 0),
		allow,
		ld(offNr),
		jeq(unix.SYS_OPENAT, 3, 0),
		jeq(unix.SYS_OPEN, 10, 0),
		jeq(unix.SYS_FALLOCATE, 14, 0),
		allow,
		// openat: dirfd, then flags
		ld(offArgs),
		jeq(atFDCWD, 1, 0),
		allow,
		ld(offArgs + 16),
		accmode,
		jeq(unix.O_RDWR, 0, 1),
		notify,
		allow,
		// open: flags
		ld(offArgs + 8),
		accmode,
		jeq(unix.O_RDWR, 0, 1),
		notify,
		allow,
		// fallocate: mode
		ld(offArgs + 8),
		jump(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, unix.FALLOC_FL_PUNCH_HOLE, 0, 1),
		notify,
		allow,
	}
}
