package container

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	capability "github.com/containerd/containerd/pkg/cap"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/cgroup"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/nsinit"
	"github.com/hull-runtime/hull/internal/guest/reaper"

	"github.com/hull-runtime/hull/internal/testenv"
)

var testReaper *reaper.Reaper

func TestMain(m *testing.M) {
	if nsinit.IsHelper() {
		nsinit.Main()
	}
	testReaper = reaper.New()
	if os.Getuid() == 0 {
		reaper.SetSubreaper()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go testReaper.Run(ctx)
	code := m.Run()
	cancel()
	os.Exit(code)
}

func needRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.Root("building containers on the host"), testenv.Files("/bin/busybox"))
}

// v2Root finds a cgroup v2 hierarchy on the host.
func v2Root(t *testing.T) string {
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	t.Skip("needs a cgroup v2 hierarchy")
	return ""
}

type env struct {
	m      *Manager
	rootfs string
	cgRoot string
}

func setup(t *testing.T) *env {
	needRoot(t)
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc"} {
		os.MkdirAll(filepath.Join(rootfs, d), 0o755)
	}
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(rootfs, "bin/busybox"), data, 0o755)
	// The applets the tests use (exec.Command cannot run here: the
	// reaper owns this process's children).
	for _, a := range []string{"sh", "cat", "echo", "sleep", "tty", "stty", "hostname", "ls", "true"} {
		os.Symlink("busybox", filepath.Join(rootfs, "bin", a))
	}
	os.WriteFile(filepath.Join(rootfs, "bin/notexec"), []byte("#!/bin/sh\n"), 0o644)
	cgRoot := filepath.Join(v2Root(t), fmt.Sprintf("hull-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_")))
	m := NewManager(Config{Reaper: testReaper, CgroupRoot: cgRoot, PtsDir: filepath.Join(dir, "pts"), Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	// Only this test's mounts (other packages' tests mount elsewhere at
	// the same time): everything the manager mounts lies under dir.
	mountsBefore := mounts(t, dir)
	t.Cleanup(func() {
		for _, id := range m.IDs() {
			if err := m.Remove(context.Background(), id, true); err != nil {
				t.Errorf("cleanup remove %s: %v", id, err)
			}
		}
		if err := unix.Rmdir(cgRoot); err != nil && !errors.Is(err, unix.ENOENT) {
			t.Errorf("removing cgroup root: %v", err)
		}
		if after := mounts(t, dir); after != mountsBefore {
			t.Errorf("mounts leaked:\nbefore %s\nafter %s", mountsBefore, after)
		}
	})
	return &env{m: m, rootfs: rootfs, cgRoot: cgRoot}
}

// mounts lists the mount points under dir.
func mounts(t *testing.T, dir string) string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return strings.Join(out, " ")
}

// allCaps are the capabilities this test process has (the helper can
// keep no more): what the containers of these tests run with.
var allCaps = func() []string { c, _ := capability.Current(); return c }()

func (e *env) spec(terminal bool, args ...string) []byte {
	s := specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: e.rootfs},
		Hostname: "hulltest",
		Process: &specs.Process{
			Terminal: terminal,
			Args:     args,
			Env:      []string{"PATH=/bin", "TERM=xterm"},
			Cwd:      "/",
			// Named, as CRI and ctr name them: no capabilities would mean none.
			Capabilities: &specs.LinuxCapabilities{Bounding: allCaps, Effective: allCaps, Permitted: allCaps},
		},
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.UTSNamespace}, {Type: specs.IPCNamespace},
		}},
	}
	data, _ := json.Marshal(s)
	return data
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func readStream(t *testing.T, e *env, id, execID string, stderr bool) string {
	t.Helper()
	p, err := e.m.Process(id, execID)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Stdout
	if stderr {
		s = p.Stderr
	}
	var out []byte
	for {
		data, eof, err := s.Read(ctx(t), 0)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data...)
		if eof {
			return string(out)
		}
	}
}

func run(t *testing.T, e *env, id string, spec []byte, stdin bool) *Process {
	t.Helper()
	if _, err := e.m.Create(ctx(t), id, spec, nil, stdin); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := e.m.Start(ctx(t), id); err != nil {
		t.Fatalf("start: %v", err)
	}
	p, err := e.m.Process(id, "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunExitCodeAndOutput(t *testing.T) {
	e := setup(t)
	p := run(t, e, "c1", e.spec(false, "sh", "-c", "echo out; echo err >&2; exit 3"), false)
	ex, err := p.Wait(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if ex.Status != 3 || ex.Signal != 0 {
		t.Fatalf("exit %+v, want 3", ex)
	}
	if out := readStream(t, e, "c1", "", false); out != "out\n" {
		t.Fatalf("stdout %q", out)
	}
	if out := readStream(t, e, "c1", "", true); out != "err\n" {
		t.Fatalf("stderr %q", out)
	}
	cg := filepath.Join(e.cgRoot, "c1")
	if err := e.m.Remove(ctx(t), "c1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cgroup %s still there: %v", cg, err)
	}
	if _, err := e.m.Process("c1", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("removed container still found: %v", err)
	}
}

func TestStdinRoundTrip(t *testing.T) {
	e := setup(t)
	p := run(t, e, "cat", e.spec(false, "cat"), true)
	in := make([]byte, 1<<20)
	rand.Read(in)
	go func() {
		for i := 0; i < len(in); i += 64 << 10 {
			if _, err := p.WriteStdin(in[i : i+64<<10]); err != nil {
				t.Error(err)
				return
			}
		}
		p.CloseStdin()
	}()
	out := readStream(t, e, "cat", "", false)
	if sha256.Sum256([]byte(out)) != sha256.Sum256(in) {
		t.Fatalf("stdin round trip differs: %d bytes back", len(out))
	}
	if ex, _ := p.Wait(ctx(t)); ex.Status != 0 {
		t.Fatalf("cat exit %+v", ex)
	}
}

func TestTerminal(t *testing.T) {
	e := setup(t)
	p := run(t, e, "tty", e.spec(true, "sh", "-c", "tty; read x; stty size"), true)
	var got []byte
	for !bytes.Contains(got, []byte("/dev/pts/")) {
		data, eof, err := p.Stdout.Read(ctx(t), 0)
		if err != nil || eof {
			t.Fatalf("tty output %q: %v eof=%v", got, err, eof)
		}
		got = append(got, data...)
	}
	if err := p.Resize(100, 40); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteStdin([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	rest := readStream(t, e, "tty", "", false)
	all := string(got) + rest
	if !strings.Contains(all, "40 100") {
		t.Fatalf("tty output %q lacks stty size 40 100", all)
	}
	if errOut := readStream(t, e, "tty", "", true); errOut != "" {
		t.Fatalf("stderr of a tty process: %q", errOut)
	}
	if ex, _ := p.Wait(ctx(t)); ex.Status != 0 {
		t.Fatalf("exit %+v", ex)
	}
}

func TestExecJoinsNamespaces(t *testing.T) {
	e := setup(t)
	p := run(t, e, "svc", e.spec(false, "sleep", "1000"), false)
	proc, _ := json.Marshal(specs.Process{Args: []string{"sh", "-c", "hostname; cat /proc/1/cmdline; echo; echo $$"}, Env: []string{"PATH=/bin"}, Cwd: "/"})
	if _, err := e.m.Exec(ctx(t), "svc", "e1", proc, false); err != nil {
		t.Fatal(err)
	}
	out := readStream(t, e, "svc", "e1", false)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || lines[0] != "hulltest" || !strings.HasPrefix(lines[1], "sleep\x001000") {
		t.Fatalf("exec output %q", out)
	}
	ep, _ := e.m.Process("svc", "e1")
	if ex, _ := ep.Wait(ctx(t)); ex.Status != 0 {
		t.Fatalf("exec exit %+v", ex)
	}
	// Exec errors are reported like create's.
	bad, _ := json.Marshal(specs.Process{Args: []string{"nosuchcmd"}, Env: []string{"PATH=/bin"}, Cwd: "/"})
	_, err := e.m.Exec(ctx(t), "svc", "e2", bad, false)
	var xe *errdefs.ExecError
	if !errors.As(err, &xe) || xe.Code != 127 {
		t.Fatalf("exec of missing command: %v", err)
	}
	if err := e.m.Signal("svc", "", unix.SIGKILL, false); err != nil {
		t.Fatal(err)
	}
	ex, _ := p.Wait(ctx(t))
	if ex.Status != 128+9 || ex.Signal != 9 {
		t.Fatalf("killed init: %+v", ex)
	}
	if err := e.m.Signal("svc", "", unix.SIGKILL, false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("signal after exit: %v", err)
	}
}

func TestCreateExecErrors(t *testing.T) {
	e := setup(t)
	for _, c := range []struct {
		args []string
		code int32
		path string
	}{
		{[]string{"nosuchcmd"}, 127, "nosuchcmd"},
		{[]string{"notexec"}, 126, "/bin/notexec"},
		{[]string{"/bin"}, 126, "/bin"},
	} {
		_, err := e.m.Create(ctx(t), "bad", e.spec(false, c.args...), nil, false)
		var xe *errdefs.ExecError
		if !errors.As(err, &xe) || xe.Code != c.code || xe.Path != c.path {
			t.Fatalf("%v: got %v, want code %d path %s", c.args, err, c.code, c.path)
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Fatalf("%v: not a failed precondition: %v", c.args, err)
		}
		if c.code == 127 && !strings.Contains(err.Error(), `exec "nosuchcmd": executable file not found in $PATH`) {
			t.Fatalf("message %q", err)
		}
		if _, err := os.Stat(filepath.Join(e.cgRoot, "bad")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("cgroup left after failed create: %v", err)
		}
		if len(e.m.IDs()) != 0 {
			t.Fatalf("container left after failed create: %v", e.m.IDs())
		}
	}
}

func TestStatsAndRemoveWithStorage(t *testing.T) {
	e := setup(t)
	// A tmpfs storage stands in for the shared rootfs.
	mp := filepath.Join(t.TempDir(), "store")
	st := []Storage{{Source: "tmpfs", FSType: "tmpfs", Options: []string{"size=1m"}, MountPoint: mp}}
	if _, err := e.m.Create(ctx(t), "st", e.spec(false, "sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 1000"), st, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(mounts(t, mp), mp) {
		t.Fatal("storage not mounted")
	}
	if err := e.m.Start(ctx(t), "st"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	s, err := e.m.Stats("st")
	if err != nil {
		t.Fatal(err)
	}
	if s.CPUUsageNs == 0 {
		t.Fatalf("cpu usage 0: %+v", s)
	}
	pids, err := e.m.Pids("st")
	if err != nil || len(pids) == 0 {
		t.Fatalf("pids %v %v", pids, err)
	}
	if err := e.m.Remove(ctx(t), "st", false); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("remove of running container without force: %v", err)
	}
	if err := e.m.Remove(ctx(t), "st", true); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(mounts(t, mp), mp) {
		t.Fatal("storage still mounted")
	}
	if _, err := os.Stat(filepath.Join(e.cgRoot, "st")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("cgroup left: %v", err)
	}
}

// Prepare leaves the cgroup root made, with the containers' controllers
// enabled, before any container: what a template's agent does before the
// snapshot.
func TestPrepare(t *testing.T) {
	needRoot(t)
	root := filepath.Join(v2Root(t), fmt.Sprintf("hull-test-%d-prepare", os.Getpid()))
	m := NewManager(Config{Reaper: testReaper, CgroupRoot: root})
	if err := m.Prepare(); err != nil {
		t.Fatal(err)
	}
	defer unix.Rmdir(root)
	avail, _ := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	on, err := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cgroup.Controllers {
		if slices.Contains(strings.Fields(string(avail)), c) && !slices.Contains(strings.Fields(string(on)), c) {
			t.Errorf("controller %s offered (%q) but not enabled (%q)", c, avail, on)
		}
	}
	if err := m.Prepare(); err != nil {
		t.Errorf("preparing again: %v", err)
	}
}

// A container without a pid namespace of its own (one that shares the
// pod's) can leave processes behind when its init exits, and no
// namespace's end kills them. They are killed when init exits, as
// containerd's runc shim does (and Remove kills whatever is still in the
// cgroup, as runc's delete does): they neither outlive the container nor
// make its removal fail with EBUSY.
func TestInitExitKillsWhatItLeftBehind(t *testing.T) {
	e := setup(t)
	var s specs.Spec
	if err := json.Unmarshal(e.spec(false, "sh", "-c", "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!"), &s); err != nil {
		t.Fatal(err)
	}
	s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(n specs.LinuxNamespace) bool { return n.Type == specs.PIDNamespace })
	spec, _ := json.Marshal(s)
	p := run(t, e, "c1", spec, false)
	if ex, err := p.Wait(ctx(t)); err != nil || ex.Status != 0 {
		t.Fatalf("init: %+v, %v", ex, err)
	}
	var pid int
	if out := readStream(t, e, "c1", "", false); func() bool { _, err := fmt.Sscan(out, &pid); return err != nil }() {
		t.Fatalf("init printed %q, not the sleep's pid", out)
	}
	cg := filepath.Join(e.cgRoot, "c1")
	deadline := time.Now().Add(5 * time.Second)
	for {
		procs, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if len(procs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("init exited 5 s ago; its cgroup still holds %q (the sleep: %d)", procs, pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The sleep may be a zombie or dying (state Z or X) until its parent
	// reaps it, and gone by the time its stat is read: each is dead.
	if err := unix.Kill(pid, 0); err == nil {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err == nil && !strings.Contains(string(b), ") Z ") && !strings.Contains(string(b), ") X ") {
			t.Errorf("pid %d (the container's sleep) alive, out of its cgroup: %s", pid, b)
		}
	}
	if err := e.m.Remove(ctx(t), "c1", false); err != nil {
		t.Fatalf("remove after init exited: %v", err)
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s still there: %v", cg, err)
	}
}
