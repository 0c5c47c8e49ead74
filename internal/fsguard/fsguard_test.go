package fsguard

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/testenv"
)

// attack is what the child, standing for a QEMU that the guest has
// taken over, tries: Allowed is the directory its policy owns (its
// share), Outside one beside it holding Secret (the host's other
// files), Target a process of the host's, TCP a port listening on
// loopback, Unix a listening socket of the host's (containerd's).
type attack struct {
	Allowed, Outside, Secret string
	Target                   int
	TCP                      int
	Unix                     string
	Root                     string // the confined child's (Policy.Root)
}

const attackEnv = "HULL_FSGUARD_ATTACK"

// TestMain doubles as the children the tests run confined: the one
// attack names in its environment variable.
func TestMain(m *testing.M) {
	for env, child := range map[string]interface{ run() }{
		attackEnv: &attack{}, cloneAttackEnv: &cloneAttack{}, openTimesEnv: &openTimes{},
	} {
		if spec := os.Getenv(env); spec != "" {
			if err := json.Unmarshal([]byte(spec), child); err != nil {
				fmt.Println("spec:", err)
				os.Exit(1)
			}
			runtime.LockOSThread()
			child.run()
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// run prints one "name outcome" line per attempt (testenv.Outcome).
func (a attack) run() {
	report := func(name string, err error) { fmt.Println(name, testenv.Outcome(err)) }
	in := func(n string) string { return filepath.Join(a.Allowed, n) }

	fmt.Println("uid", os.Getuid())
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:\t"); ok {
			fmt.Println("capeff", v)
		}
	}

	// What the 9p server does for guest root in its share: all allowed.
	report("create", os.WriteFile(in("file"), []byte("x"), 0o644))
	report("mkdir", errors.Join(os.Mkdir(in("a"), 0o755), os.Mkdir(in("b"), 0o755), os.WriteFile(in("a/f"), nil, 0o644)))
	report("rename-across", os.Rename(in("a/f"), in("b/f")))
	report("symlink", os.Symlink("/etc/passwd", in("link")))
	report("mkfifo", unix.Mkfifo(in("fifo"), 0o600))
	report("remove", errors.Join(os.Remove(in("b/f")), os.Remove(in("a")), os.Remove(in("link"))))
	report("mknod-fifo", unix.Mknod(in("fifo2"), unix.S_IFIFO|0o600, 0))

	// What guest root must not get from it (the filter).
	report("mknod-blk", unix.Mknod(in("blk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	report("mknodat-chr", unix.Mknodat(unix.AT_FDCWD, in("chr"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	fd, err := unix.Open(in("plain"), unix.O_CREAT|unix.O_WRONLY, 0o755)
	report("open-plain", err)
	if err == nil {
		report("fchmod-suid", unix.Fchmod(fd, 0o4755))
		unix.Close(fd)
	}
	report("chmod-plain", unix.Chmod(in("plain"), 0o700))
	report("chmod-suid", unix.Chmod(in("plain"), 0o4755))
	report("fchmodat-sgid", unix.Fchmodat(unix.AT_FDCWD, in("plain"), 0o2755, 0))
	_, err = unix.Openat(unix.AT_FDCWD, in("suid-new"), unix.O_CREAT|unix.O_WRONLY, 0o4755)
	report("openat-suid", err)
	report("setxattr", unix.Setxattr(in("plain"), "security.capability", []byte{1}, 0))
	report("lsetxattr", unix.Lsetxattr(in("plain"), "user.x", []byte{1}, 0))

	// What a fallen QEMU would do next: the host's files, by path and
	// by walking up from its share's descriptor.
	report("write-outside", os.WriteFile(filepath.Join(a.Outside, "planted"), []byte("x"), 0o644))
	_, err = os.ReadFile(a.Secret)
	report("read-outside", err)
	if dfd, err := unix.Open(a.Allowed, unix.O_PATH|unix.O_DIRECTORY, 0); err == nil {
		rel := filepath.Join("..", filepath.Base(a.Outside), filepath.Base(a.Secret))
		fd, err := unix.Openat(dfd, rel, unix.O_RDONLY, 0)
		report("dotdot-read", err)
		if err == nil {
			unix.Close(fd)
		}
		_, err = unix.Openat(dfd, "../"+filepath.Base(a.Outside)+"/planted2", unix.O_CREAT|unix.O_WRONLY, 0o644)
		report("dotdot-write", err)
		// Landlock does not govern owners and modes, and the 9p server's
		// capabilities allow both on any file: given away upwards.
		report("dotdot-chown", unix.Fchownat(dfd, rel, 65534, 65534, 0))
		report("dotdot-chmod", unix.Fchmodat(dfd, rel, 0o666, 0))
	}
	report("chown-outside", unix.Chown(a.Secret, 65534, 65534))
	// Other processes: their memory, tracing them, signalling them.
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", a.Target))
	report("proc-mem", err)
	if err == nil {
		f.Close()
	}
	report("ptrace", unix.PtraceSeize(a.Target))
	report("kill", unix.Kill(a.Target, 0))
	_, err = os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", a.Target)) // what the host runs, with what arguments
	report("proc-cmdline", err)
	// The host's network, and its services' sockets (containerd's).
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	report("socket-inet", err)
	if err == nil {
		report("tcp-connect", unix.Connect(s, &unix.SockaddrInet4{Port: a.TCP, Addr: [4]byte{127, 0, 0, 1}}))
		unix.Close(s)
	}
	s, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	report("socket-unix", err)
	if err == nil {
		report("unix-connect", unix.Connect(s, &unix.SockaddrUnix{Name: a.Unix}))
		unix.Close(s)
	}
	// The kernel's.
	report("unshare", unix.Unshare(unix.CLONE_NEWNS))
	_, err = unix.OpenByHandleAt(unix.AT_FDCWD, unix.NewFileHandle(1, make([]byte, 8)), unix.O_RDONLY)
	report("open-by-handle", err)
	report("finit-module", unix.FinitModule(0, "", 0))
	// Last, as it moves the child's root: a second chroot out of the
	// first, then the host's files by path.
	report("chroot-escape", chrootEscape(a.Allowed, a.Secret))
}

// chrootEscape chroots into a directory of the share, walks ".." from
// the working directory left outside it, chroots there and changes
// secret's mode by its absolute path.
func chrootEscape(share, secret string) error {
	jail := filepath.Join(share, "jail")
	if err := os.Mkdir(jail, 0o700); err != nil {
		return err
	}
	if err := errors.Join(unix.Chdir(share), unix.Chroot(jail)); err != nil {
		return err
	}
	for range 64 {
		if err := unix.Chdir(".."); err != nil {
			return err
		}
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	return unix.Chmod(secret, 0o640)
}

// childPolicy is QEMU's, for the test binary: its code and libraries,
// /dev/null, and the share.
func childPolicy(allowed, root string) Policy {
	return Policy{Root: root, Rules: []Rule{
		{Path: "/usr", Access: Exec},
		{Path: "/etc/ld.so.cache", Access: Read},
		{Path: "/dev/null", Access: Write},
		{Path: "/proc", Access: Read}, // the child reports its capabilities
		{Path: os.Args[0], Access: Exec},
		{Path: allowed, Access: Own},
	}}
}

// testUID is the confined child's user, as QEMU's own.
const testUID = 0x7e00beef

// runAttack runs the attacking child, confined to its policy when
// confine is set (runChild).
func runAttack(t *testing.T, a attack, confine bool) map[string]string {
	if !confine {
		return runChild(t, nil, attackEnv, a)
	}
	p := childPolicy(a.Allowed, a.Root)
	return runChild(t, &p, attackEnv, a)
}

// runChild runs the test binary with spec in env as TestMain's child,
// from a thread confined to p as QEMU is started (as testUID where p has
// a root of its own), or from an ordinary one (p nil, the control), and
// returns its "name outcome" lines, with the Landlock ABI Confine used
// as "landlock". The confinement is closed before it returns.
func runChild(t testing.TB, p *Policy, env string, spec any) map[string]string {
	b, _ := json.Marshal(spec)
	type result struct {
		out []byte
		abi int
		err error
	}
	res := make(chan result, 1)
	OnOwnThread(func() {
		var c *Confinement
		if p != nil {
			confinedTids.add(unix.Gettid())
			var err error
			if c, err = Confine(*p); err != nil {
				res <- result{err: err}
				return
			}
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env+"="+string(b))
		if p != nil && p.Root != "" {
			// as QEMU: not root (the test binary's directory, which is
			// root's alone, is in the root as a path open to all)
			cmd.SysProcAttr = &syscall.SysProcAttr{}
			AsUser(cmd.SysProcAttr, testUID)
		}
		out, err := cmd.CombinedOutput()
		c.Close()
		r := result{out: out, err: err}
		if c != nil {
			r.abi = c.LandlockABI
		}
		res <- r
	})
	r := <-res
	if r.err != nil {
		t.Fatalf("child: %v\n%s", r.err, r.out)
	}
	got := testenv.ParseOutcomes(string(r.out))
	got["landlock"] = strconv.Itoa(r.abi)
	return got
}

// A process started from a confined thread, as every QEMU is, does for
// its share what QEMU's 9p server needs, and nothing of what a QEMU that
// the guest took over would try next; the same process started from
// an ordinary thread (the control) can do all of it, so each refusal
// is the confinement's. On a kernel without a usable Landlock, the
// capabilities and the filter still hold.
func TestFallenQEMU(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: run `go test ./internal/fsguard` as root")
	}
	if LandlockABI() < MinLandlockABI {
		t.Skip("this kernel has no Landlock ABI 2 or later")
	}
	target := exec.Command("sleep", "60")
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Process.Kill(); target.Wait() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() }) // the kernel completes a connect to its backlog
	unixLn, err := net.Listen("unix", filepath.Join(t.TempDir(), "service.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unixLn.Close() })

	// run runs the child: confined, with a root of its own (ownRoot) or
	// the host's, or as the control.
	run := func(confine, ownRoot bool) map[string]string {
		root := t.TempDir()
		a := attack{Allowed: filepath.Join(root, "share"), Outside: filepath.Join(root, "host"), Target: target.Process.Pid,
			TCP: ln.Addr().(*net.TCPAddr).Port, Unix: unixLn.Addr().String()}
		a.Secret = filepath.Join(a.Outside, "secret")
		for _, d := range []string{a.Allowed, a.Outside, filepath.Join(root, "root")} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if ownRoot {
			a.Root = filepath.Join(root, "root")
		}
		if err := os.WriteFile(a.Secret, []byte("host"), 0o600); err != nil {
			t.Fatal(err)
		}
		got := runAttack(t, a, confine)
		if !confine {
			return got
		}
		for _, n := range []string{"planted", "planted2"} {
			if _, err := os.Lstat(filepath.Join(a.Outside, n)); err == nil {
				t.Errorf("confined child planted %s outside its share", n)
			}
		}
		var st unix.Stat_t
		if err := unix.Stat(a.Secret, &st); ownRoot && (err != nil || st.Mode&0o7777 != 0o600 || st.Uid != 0) {
			t.Errorf("the host's file after the confined child: mode %o, uid %d (%v); want 600, 0", st.Mode&0o7777, st.Uid, err)
		}
		if ents, err := os.ReadDir(filepath.Join(root, "root")); err != nil || len(ents) != 0 {
			t.Errorf("the root's directory on the host: %v, %v; want it empty", ents, err)
		}
		return got
	}
	shared := map[string]string{
		"create": "ok", "mkdir": "ok", "rename-across": "ok", "symlink": "ok", "mkfifo": "ok", "remove": "ok",
		"mknod-fifo": "ok", "open-plain": "ok", "chmod-plain": "ok",
	}
	// Everything but the host's files, which the root and Landlock each
	// keep out of reach (the root's ENOENT is the first to answer).
	filter := map[string]string{
		"capeff": fmt.Sprintf("%016x", KeptMask()),
		// the filter, for the 9p server
		"mknod-blk": "operation not permitted", "mknodat-chr": "operation not permitted",
		"fchmod-suid": "operation not permitted", "chmod-suid": "operation not permitted",
		"fchmodat-sgid": "operation not permitted", "openat-suid": "operation not permitted",
		"setxattr": "operation not supported", "lsetxattr": "operation not supported",
		// other processes
		"ptrace": "operation not permitted",
		// the network, the host's services
		"socket-inet": "operation not permitted", "socket-unix": "operation not permitted",
		// the kernel; a chroot out of a chroot
		"unshare": "operation not permitted", "open-by-handle": "operation not permitted",
		"finit-module": "operation not permitted", "chroot-escape": "operation not permitted",
	}
	with := func(m map[string]string, more ...string) map[string]string {
		m = maps.Clone(m)
		for i := 0; i < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	// The host's files, however named, their owners and modes included.
	noent := "no such file or directory"
	// Not root: no signal to root's processes, Landlock or not; its /proc
	// shows its own user's processes alone.
	rooted := with(filter, "write-outside", noent, "read-outside", noent, "dotdot-read", noent, "dotdot-write", noent,
		"dotdot-chown", noent, "dotdot-chmod", noent, "chown-outside", noent,
		"uid", strconv.Itoa(testUID), "kill", "operation not permitted", "proc-cmdline", noent, "proc-mem", noent)
	abi := strconv.Itoa(LandlockABI())
	confined := with(rooted, "landlock", abi)
	// Landlock alone refuses the host's files, not their owners and
	// modes, which is why there is a root.
	denied := "permission denied"
	landlockOnly := with(filter, "landlock", abi, "uid", "0", "kill", "operation not permitted", "proc-mem", denied, "write-outside", denied,
		"read-outside", denied, "dotdot-read", denied, "dotdot-write", denied)
	control := map[string]string{
		"uid": "0", "mknod-blk": "ok", "chmod-suid": "ok", "write-outside": "ok", "read-outside": "ok",
		"dotdot-read": "ok", "dotdot-write": "ok", "proc-mem": "ok", "ptrace": "ok", "kill": "ok", "proc-cmdline": "ok",
		"socket-inet": "ok", "tcp-connect": "ok", "socket-unix": "ok", "unix-connect": "ok", "unshare": "ok",
		"dotdot-chown": "ok", "dotdot-chmod": "ok", "chown-outside": "ok", "chroot-escape": "ok",
	}
	// A kernel without Landlock, or with only ABI 1: the root, the user,
	// the capabilities and the filter hold (hull check says what is
	// missing).
	noLandlock := with(rooted, "landlock", "0")
	for _, c := range []struct {
		name             string
		confine, ownRoot bool
		abi              int // the kernel's, as Confine sees it; -1: this one's
		want             map[string]string
	}{{"confined", true, true, -1, confined}, {"control", false, false, -1, control},
		{"landlock-without-root", true, false, -1, landlockOnly},
		{"no-landlock", true, true, 0, noLandlock}, {"landlock-abi-1", true, true, 1, noLandlock}} {
		t.Run(c.name, func(t *testing.T) {
			if c.abi >= 0 {
				kernelABI = func() int { return c.abi }
				defer func() { kernelABI = LandlockABI }()
			}
			got := run(c.confine, c.ownRoot)
			testenv.CheckOutcomes(t, got, shared)
			testenv.CheckOutcomes(t, got, c.want)
		})
	}
}

// The confinement is the confining thread's and its children's: the
// process's other threads (the shim's, which serve containerd) have
// none of it, and a process the thread starts has it from its first
// instruction.
func TestConfineOnlyItsThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: run `go test ./internal/fsguard` as root")
	}
	status, err := os.ReadFile("/proc/thread-self/status") // an unconfined thread's
	if err != nil {
		t.Fatal(err)
	}
	_, bnd, _ := strings.Cut(string(status), "\nCapBnd:\t")
	bnd, _, _ = strings.Cut(bnd, "\n")
	type result struct {
		tid   int
		child []byte
		err   error
	}
	res := make(chan result, 1)
	OnOwnThread(func() {
		r := result{tid: unix.Gettid()}
		confinedTids.add(r.tid)
		if _, r.err = Confine(Policy{Rules: []Rule{
			{Path: "/usr", Access: Exec}, {Path: "/etc/ld.so.cache", Access: Read},
			{Path: "/dev/null", Access: Write}, {Path: "/proc", Access: Read},
		}}); r.err == nil {
			r.child, r.err = exec.Command("grep", "-E", "^(CapBnd|Seccomp_filters|NoNewPrivs):", "/proc/self/status").Output()
		}
		res <- r
	})
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	if want := fmt.Sprintf("NoNewPrivs:\t1\nSeccomp_filters:\t1\nCapBnd:\t%016x\n", KeptMask()); !sameLines(string(r.child), want) {
		t.Errorf("a child of the thread: %q, want %q", r.child, want)
	}
	// The test's own threads: none confined (the confining one has ended).
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if confinedTids.has(task.Name()) {
			continue
		}
		var b []byte
		if b, err = os.ReadFile("/proc/self/task/" + task.Name() + "/status"); err == nil && !unconfined(string(b), bnd) {
			t.Errorf("thread %s of the process is confined too:\n%s", task.Name(), b)
		}
	}
}

// confinedTids are the threads the tests confined: each ends with its
// goroutine, but may still be ending when another test looks.
var confinedTids tids

type tids struct {
	mu sync.Mutex
	m  map[string]bool
}

func (t *tids) add(tid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]bool{}
	}
	t.m[strconv.Itoa(tid)] = true
}

func (t *tids) has(tid string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[tid]
}

func unconfined(status, bnd string) bool {
	for _, want := range []string{"\nSeccomp:\t0\n", "\nNoNewPrivs:\t0\n", "\nCapBnd:\t" + bnd + "\n"} {
		if !strings.Contains(status, want) {
			return false
		}
	}
	return true
}

func sameLines(a, b string) bool {
	x, y := strings.Fields(a), strings.Fields(b)
	if len(x) != len(y) {
		return false
	}
	seen := map[string]int{}
	for _, f := range x {
		seen[f]++
	}
	for _, f := range y {
		if seen[f]--; seen[f] < 0 {
			return false
		}
	}
	return true
}

// OnOwnThread never runs f on the process's main thread, whatever thread
// Go would pick, and Confine refuses that thread.
func TestOnOwnThreadIsNotTheMainThread(t *testing.T) {
	for i := 0; i < 200; i++ {
		res := make(chan int, 1)
		OnOwnThread(func() { res <- unix.Gettid() })
		if tid := <-res; tid == unix.Getpid() {
			t.Fatalf("round %d: f ran on the main thread (%d)", i, tid)
		}
	}
	// Package init runs on the main thread (Go locks the main goroutine
	// to it until main starts): the child confines from there.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mainThreadEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "refused: confining the process's main thread") {
		t.Fatalf("Confine on the main thread: %q, %v", out, err)
	}
}

const mainThreadEnv = "HULL_FSGUARD_MAIN_THREAD"

func init() {
	if os.Getenv(mainThreadEnv) == "" {
		return
	}
	if _, err := Confine(Policy{}); err != nil {
		fmt.Println("refused:", err)
		os.Exit(0)
	}
	fmt.Println("confined the main thread")
	os.Exit(0)
}

// A rule's path may go through one of the host's top-level symlinks (a
// merged /usr's /bin, where PATH may find QEMU): the root reaches it
// through the same symlink, made again there.
func TestRootThroughTopLevelSymlink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test: run `go test ./internal/fsguard` as root")
	}
	if fi, err := os.Lstat("/bin"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Skip("/bin is not a symlink on this host")
	}
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	res := make(chan error, 1)
	OnOwnThread(func() {
		confinedTids.add(unix.Gettid())
		_, err := Confine(Policy{Root: root, Rules: []Rule{
			{Path: "/usr/lib", Access: Exec}, {Path: "/usr/lib64", Access: Exec}, {Path: "/etc/ld.so.cache", Access: Read},
			{Path: "/dev/null", Access: Write}, {Path: "/bin/true", Access: Exec},
		}})
		if err == nil {
			err = exec.Command("/bin/true").Run()
		}
		res <- err
	})
	if err := <-res; err != nil {
		t.Fatalf("/bin/true in a root with a rule for it: %v", err)
	}
}
