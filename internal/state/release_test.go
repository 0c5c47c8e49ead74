package state

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/mountinfo"
	"github.com/hull-runtime/hull/internal/testenv"
)

// fakeReleasers records the keys it is asked to release and fails those
// in fail.
func fakeReleasers(got *[]string, fail map[string]error) Releasers {
	fn := func(_ context.Context, r Resource) error {
		*got = append(*got, r.Key)
		return fail[r.Key]
	}
	return Releasers{KindFile: fn, KindDir: fn, KindTap: fn}
}

func TestReleaseNewestFirstAndRemovesTheSandbox(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	for _, k := range []string{"/a", "/b", "/c"} {
		if err := h.Record(Resource{Kind: KindFile, Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := Release(context.Background(), h, "", fakeReleasers(&got, nil)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/c", "/b", "/a"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	if ents, _ := os.ReadDir(s.Root); len(ents) != 0 {
		t.Fatalf("root still holds %v", ents)
	}
	if st := h.State(); st.Phase != PhaseReleased || len(st.Resources) != 0 {
		t.Fatalf("state after release: %+v", st)
	}
	// Idempotent: again on the same handle, and through the store.
	got = nil
	if err := Release(context.Background(), h, "", fakeReleasers(&got, nil)); err != nil || len(got) != 0 {
		t.Fatalf("second Release: %v, released %v", err, got)
	}
	if err := s.Release(context.Background(), "sb", fakeReleasers(&got, nil)); err != nil || len(got) != 0 {
		t.Fatalf("Store.Release of a released sandbox: %v, released %v", err, got)
	}
	if err := h.Record(Resource{Kind: KindFile, Key: "/d"}); !errors.Is(err, ErrReleased) {
		t.Fatalf("Record after release: %v", err)
	}
}

func TestReleaseJoinsErrorsAndKeepsWhatFailed(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	for _, r := range []Resource{
		{Kind: KindFile, Key: "/a"},
		{Kind: KindFile, Key: "/b"},
		{Kind: KindMacvtap, Key: "ns/mv0"}, // no releaser
		{Kind: KindFile, Key: "/c"},
	} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	busy := errors.New("busy")
	err := Release(context.Background(), h, "", fakeReleasers(&got, map[string]error{"/b": busy}))
	if !errors.Is(err, busy) {
		t.Fatalf("err = %v, want it to wrap busy", err)
	}
	for _, want := range []string{"releasing file /b: busy", `releasing macvtap ns/mv0: no releaser for kind "macvtap"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err %q does not contain %q", err, want)
		}
	}
	if want := []string{"/c", "/b", "/a"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("released %v, want %v (go on after a failure)", got, want)
	}
	st := h.State()
	if len(st.Resources) != 2 || st.Resources[0].Key != "/b" || st.Resources[1].Key != "ns/mv0" || st.Phase != PhaseStopping {
		t.Fatalf("left %+v", st)
	}
	if _, err := os.Stat(s.Dir("sb")); err != nil {
		t.Fatalf("sandbox removed although resources are left: %v", err)
	}
	// The next attempt only retries what is left.
	got = nil
	rs := fakeReleasers(&got, nil)
	rs[KindMacvtap] = rs[KindFile]
	if err := Release(context.Background(), h, "", rs); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ns/mv0", "/b"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("retried %v, want %v", got, want)
	}
}

func TestReleaseOneContainer(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	for _, r := range []Resource{
		{Kind: KindDir, Key: "/sandbox"},
		{Kind: KindDir, Key: "/c1/rootfs", Container: "c1"},
		{Kind: KindFile, Key: "/c2/f", Container: "c2"},
		{Kind: KindFile, Key: "/c1/f", Container: "c1"},
	} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := Release(context.Background(), h, "c1", fakeReleasers(&got, nil)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/c1/f", "/c1/rootfs"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	st := h.State()
	if len(st.Resources) != 2 || st.Phase != PhaseCreating {
		t.Fatalf("container release touched the sandbox: %+v", st)
	}
	if _, err := os.Stat(s.Dir("sb")); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseStopsWhenContextIsDone(t *testing.T) {
	h := mustCreate(t, newStore(t), "sb")
	if err := h.Record(Resource{Kind: KindFile, Key: "/a"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var got []string
	if err := Release(ctx, h, "", fakeReleasers(&got, nil)); !errors.Is(err, context.Canceled) || len(got) != 0 {
		t.Fatalf("Release = %v, released %v", err, got)
	}
}

// TestRecordedButNeverAcquired is the crash between Record and the
// acquisition: every built-in releaser must take "not there" for released.
func TestRecordedButNeverAcquired(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	base := filepath.Join(s.Dir("sb"), "never")
	for _, r := range []Resource{
		{Kind: KindProcess, Key: "qemu", Data: map[string]string{"role": RoleQEMU}}, // recorded before start
		{Kind: KindProcess, Key: "gone", Pid: 1 << 30, StartTime: 1},
		{Kind: KindMount, Key: base + "/mnt"},
		{Kind: KindDir, Key: base + "/dir"},
		{Kind: KindFile, Key: base + "/file"},
		{Kind: KindSocket, Key: base + "/sock"},
		{Kind: KindCgroup, Key: base + "/cgroup"},
	} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := Release(context.Background(), h, "", BuiltinReleasers()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Dir("sb")); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir: %v", err)
	}
}

func TestBuiltinFileDirSocketRelease(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	outside := t.TempDir()
	dir := filepath.Join(outside, "shared")
	file := filepath.Join(outside, "console.log")
	if err := h.Record(Resource{Kind: KindDir, Key: dir}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := h.Record(Resource{Kind: KindFile, Key: file}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Release(context.Background(), h, "", BuiltinReleasers()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, file} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", p, err)
		}
	}
}

// startSleep starts a child that sleeps and is killed at cleanup.
func startSleep(t *testing.T) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-waited })
	st, err := ProcessStartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd, st
}

func TestReleaseProcessKillsTheRecordedProcess(t *testing.T) {
	cmd, start := startSleep(t)
	r := Resource{Kind: KindProcess, Key: "sleep", Pid: cmd.Process.Pid, StartTime: start}
	began := time.Now()
	if err := ReleaseProcess(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if ProcessAlive(r.Pid, start) {
		t.Fatal("process still running")
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("release took %v", d)
	}
	if err := ReleaseProcess(context.Background(), r); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

func TestReleaseProcessSparesAReusedPid(t *testing.T) {
	cmd, start := startSleep(t)
	r := Resource{Kind: KindProcess, Key: "sleep", Pid: cmd.Process.Pid, StartTime: start + 1}
	if err := ReleaseProcess(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if !ProcessAlive(cmd.Process.Pid, start) {
		t.Fatal("a process with another start time was killed")
	}
}

func TestReleaseProcessRefusesWithoutStartTime(t *testing.T) {
	cmd, start := startSleep(t)
	r := Resource{Kind: KindProcess, Key: "sleep", Pid: cmd.Process.Pid}
	if err := ReleaseProcess(context.Background(), r); err == nil {
		t.Fatal("released a pid without a start time")
	}
	if !ProcessAlive(cmd.Process.Pid, start) {
		t.Fatal("killed a pid without a start time")
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.Root("mounts"))
}

// mountTmpfs mounts a tmpfs at dir, unmounting it at cleanup if the test
// did not.
func mountTmpfs(t *testing.T, dir, opts string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// mount -t tmpfs -o OPTS tmpfs DIR
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Fatalf("mounting tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		for {
			if m, _ := isMountPoint(dir); !m {
				return
			}
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmounting %s: %v", dir, err)
				return
			}
		}
	})
}

func TestReleaseMountStacked(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "rootfs")
	mountTmpfs(t, dir, "size=1m")
	mountTmpfs(t, dir, "size=1m")
	r := Resource{Kind: KindMount, Key: dir}
	if err := ReleaseMount(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	if m, err := isMountPoint(dir); m || err != nil {
		t.Fatalf("still mounted: %v %v", m, err)
	}
	if err := ReleaseMount(context.Background(), r); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

func TestReleaseDirRefusesAMountUnderIt(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "shared")
	data := filepath.Join(dir, "c1", "volume")
	mountTmpfs(t, data, "size=1m")
	precious := filepath.Join(data, "user-data")
	if err := os.WriteFile(precious, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := ReleaseDir(context.Background(), Resource{Kind: KindDir, Key: dir})
	if err == nil || !strings.Contains(err.Error(), data) {
		t.Fatalf("ReleaseDir = %v, want a refusal naming %s", err, data)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Fatalf("data behind the mount was touched: %v", err)
	}
	// Through Release, the mount (recorded after the dir) goes first.
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	for _, r := range []Resource{{Kind: KindDir, Key: dir}, {Kind: KindMount, Key: data}} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := Release(context.Background(), h, "", BuiltinReleasers()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dir still there: %v", err)
	}
}

func TestReleaseKeepsSandboxDirWithAMountInside(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	// Mounted under the sandbox dir but never recorded: a bug elsewhere,
	// which must not turn into deleting through the mount.
	mountTmpfs(t, filepath.Join(s.Dir("sb"), "shared", "rootfs"), "size=1m")
	err := Release(context.Background(), h, "", BuiltinReleasers())
	if err == nil || !strings.Contains(err.Error(), "mounted under it") {
		t.Fatalf("Release = %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir("sb"), "state.json")); err != nil {
		t.Fatalf("state file gone: %v", err)
	}
}

// TestFullDiskKeepsPreviousState fails a save for real: a tiny tmpfs that
// fills up.
func TestFullDiskKeepsPreviousState(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "run")
	mountTmpfs(t, root, "size=8k")
	s := &Store{Root: root}
	h, err := s.Create("sb", Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	path := filepath.Join(s.Dir("sb"), "state.json")
	before := readFile(t, path)
	big := map[string]string{"blob": strings.Repeat("x", 64*1024)}
	err = h.Record(Resource{Kind: KindFile, Key: "/big", Data: big})
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("Record on a full disk: %v, want ENOSPC", err)
	}
	if after := readFile(t, path); string(after) != string(before) {
		t.Fatal("state file changed by a failed save")
	}
	if err := Release(context.Background(), h, "", BuiltinReleasers()); err != nil {
		t.Fatal(err)
	}
}

// cgroupParent is a hierarchy a test may make cgroups in, as the shim
// finds them (cgroup.Hierarchies): the unified one, else the hybrid host's
// cgroup2 mount or a v1 hierarchy. A v1 cpuset is left out: a process
// enters one of its new cgroups only once CPUs are given to it.
func cgroupParent(t *testing.T) string {
	t.Helper()
	hs, err := cgroup.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	v1 := ""
	for _, h := range hs {
		if h.V2 {
			return h.Mount
		}
		if v1 == "" && !h.Cpuset {
			v1 = h.Mount
		}
	}
	if v1 == "" {
		t.Fatalf("no cgroup hierarchy to make a cgroup in: %+v", hs)
	}
	return v1
}

func TestReleaseCgroup(t *testing.T) {
	requireRoot(t)
	parent := cgroupParent(t)
	cg := filepath.Join(parent, "hull-state-test-"+time.Now().Format("150405.000000"))
	if err := os.MkdirAll(filepath.Join(cg, "child"), 0o755); err != nil {
		t.Fatalf("creating a cgroup in %s: %v", parent, err)
	}
	t.Cleanup(func() { rmdirCgroup(cg) })
	cmd, start := startSleep(t)
	if err := os.WriteFile(filepath.Join(cg, "child", "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatalf("moving a process into a cgroup of %s: %v", parent, err)
	}
	err := ReleaseCgroup(context.Background(), Resource{Kind: KindCgroup, Key: cg})
	if err == nil || !strings.Contains(err.Error(), "busy (1 processes") {
		t.Fatalf("ReleaseCgroup of a busy cgroup = %v", err)
	}
	if err := ReleaseProcess(context.Background(), Resource{Kind: KindProcess, Key: "s", Pid: cmd.Process.Pid, StartTime: start}); err != nil {
		t.Fatal(err)
	}
	// The zombie leaves the cgroup only once reaped.
	cmd.Process.Kill()
	deadline := time.Now().Add(2 * time.Second)
	for {
		err = ReleaseCgroup(context.Background(), Resource{Kind: KindCgroup, Key: cg})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Fatalf("cgroup still there: %v", err)
	}
}

// isMountPoint says whether path (already resolved) is a mount point.
func isMountPoint(path string) (bool, error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.MountPoint == path {
			return true, nil
		}
	}
	return false, nil
}
