package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/state"
	"golang.org/x/sys/unix"
)

// deadProcess returns the pid and start time of a process that has
// exited and been reaped.
func deadProcess(t *testing.T) (int, uint64) {
	t.Helper()
	cmd := exec.Command("cat")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	start, err := state.ProcessStartTime(cmd.Process.Pid)
	in.Close()
	cmd.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, start
}

// liveSleep starts a sleep that is not our child's business to reap
// promptly: the test's cleanup kills and reaps it if gc did not.
func liveSleep(t *testing.T) (int, uint64) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	start, err := state.ProcessStartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid, start
}

func runHull(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := Main(args, nil, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestGCReleasesOrphansAndLeavesLiveSandboxes(t *testing.T) {
	root := t.TempDir()
	store := &state.Store{Root: root}
	shimPid, shimStart := deadProcess(t)
	qemuPid, qemuStart := liveSleep(t)

	orphan, err := store.Create("orphan", state.Sandbox{Namespace: "k8s.io", ShimPid: shimPid, ShimStartTime: shimStart})
	if err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(store.Dir("orphan"), "shared")
	rootfs := filepath.Join(shared, "c1", "rootfs")
	outside := filepath.Join(t.TempDir(), "scratch")
	record := func(r state.Resource) {
		t.Helper()
		if err := orphan.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	record(state.Resource{Kind: state.KindDir, Key: shared})
	record(state.Resource{Kind: state.KindDir, Key: outside})
	record(state.Resource{Kind: state.KindProcess, Key: "qemu", Pid: qemuPid, StartTime: qemuStart, Data: map[string]string{"role": state.RoleQEMU}})
	for _, d := range []string{rootfs, outside} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mounted := os.Geteuid() == 0
	if mounted {
		record(state.Resource{Kind: state.KindMount, Key: rootfs, Container: "c1"})
		// mount -t tmpfs tmpfs ROOTFS
		if err := unix.Mount("tmpfs", rootfs, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	} else {
		t.Log("not root: the orphan has no tmpfs mount (run as root to cover mounts)")
	}
	orphan.Close() // the shim "died"

	live, err := store.Create("live", state.Sandbox{}) // owned by this process
	if err != nil {
		t.Fatal(err)
	}
	liveDir := filepath.Join(store.Dir("live"), "shared")
	if err := live.Record(state.Resource{Kind: state.KindDir, Key: liveDir}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(liveDir, 0o700); err != nil {
		t.Fatal(err)
	}
	live.Close()
	t.Cleanup(func() { store.Release(t.Context(), "live", state.BuiltinReleasers()) })

	// --dry-run says what it would do and does nothing.
	code, out, errOut := runHull(t, "gc", "--root", root, "--dry-run")
	if code != 0 {
		t.Fatalf("gc --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	want := []string{"sandbox orphan: shim " + itoa(shimPid) + " is gone"}
	if mounted {
		want = append(want, "would release mount "+rootfs)
	}
	want = append(want,
		"would release process qemu (pid "+itoa(qemuPid)+")",
		"would release dir "+outside,
		"would release dir "+shared,
		"would remove sandbox orphan")
	if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("gc --dry-run printed\n%s\nwant\n%s", out, strings.Join(want, "\n"))
	}
	if !state.ProcessAlive(qemuPid, qemuStart) {
		t.Fatal("dry run killed the process")
	}
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatal("dry run removed a directory")
	}

	code, out, errOut = runHull(t, "gc", "--root", root)
	if code != 0 {
		t.Fatalf("gc: exit %d\n%s%s", code, out, errOut)
	}
	for i := range want {
		want[i] = strings.Replace(want[i], "would release", "released", 1)
	}
	want[len(want)-1] = "removed sandbox orphan"
	if got := strings.TrimSpace(out); got != strings.Join(want, "\n") {
		t.Fatalf("gc printed\n%s\nwant\n%s", out, strings.Join(want, "\n"))
	}
	if state.ProcessAlive(qemuPid, qemuStart) {
		t.Fatal("the orphan's process survived")
	}
	for _, p := range []string{store.Dir("orphan"), outside} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still exists: %v", p, err)
		}
	}
	if _, err := os.Stat(liveDir); err != nil {
		t.Fatalf("gc touched the live sandbox: %v", err)
	}

	code, out, errOut = runHull(t, "gc", "--root", root)
	if code != 0 || strings.TrimSpace(out) != "nothing to collect" {
		t.Fatalf("second gc: exit %d\n%s%s", code, out, errOut)
	}
}

func TestGCFailsOnWhatItCannotRelease(t *testing.T) {
	root := t.TempDir()
	store := &state.Store{Root: root}
	pid, start := deadProcess(t)
	h, err := store.Create("sb", state.Sandbox{ShimPid: pid, ShimStartTime: start})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	// Clean up what the test made.
	t.Cleanup(func() {
		h, err := store.Open("sb")
		if err == nil {
			h.Forget("unknown-kind", "x0")
			state.Release(t.Context(), h, "", state.BuiltinReleasers())
			h.Close()
		}
	})
	if h, err = store.Open("sb"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(store.Dir("sb"), "d")
	for _, r := range []state.Resource{
		{Kind: "unknown-kind", Key: "x0"}, // nobody registered a releaser
		{Kind: state.KindDir, Key: dir},
	} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	code, out, errOut := runHull(t, "gc", "--root", root)
	if code == 0 {
		t.Fatalf("gc succeeded although a resource has no releaser:\n%s", out)
	}
	if !strings.Contains(out, "released dir "+dir) || !strings.Contains(errOut, `hull gc: sandbox sb: releasing unknown-kind x0: no releaser for kind "unknown-kind"`) {
		t.Fatalf("gc printed\n%s\nstderr\n%s", out, errOut)
	}
	list, _ := store.List()
	if len(list) != 1 || len(list[0].Resources) != 1 {
		t.Fatalf("state after a partial gc: %+v", list)
	}
}

func TestPsJSON(t *testing.T) {
	root := t.TempDir()
	store := &state.Store{Root: root}
	deadPid, deadStart := deadProcess(t)
	qemuPid, qemuStart := liveSleep(t)
	h, err := store.Create("sb1", state.Sandbox{Namespace: "k8s.io", ShimPid: deadPid, ShimStartTime: deadStart})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []state.Resource{
		{Kind: state.KindProcess, Key: "qemu", Pid: qemuPid, StartTime: qemuStart, Data: map[string]string{"role": state.RoleQEMU}},
		{Kind: state.KindDir, Key: "/nonexistent/a"},
		{Kind: state.KindDir, Key: "/nonexistent/b"},
	} {
		if err := h.Record(r); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	h2, err := store.Create("sb2", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	h2.Close()
	t.Cleanup(func() {
		store.Release(t.Context(), "sb1", state.Releasers{state.KindDir: state.ReleaseDir, state.KindProcess: state.ReleaseProcess})
		store.Release(t.Context(), "sb2", nil)
	})

	code, out, errOut := runHull(t, "ps", "--root", root, "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got []PsEntry
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(got) != 2 {
		t.Fatalf("got %d entries:\n%s", len(got), out)
	}
	a, b := got[0], got[1]
	if a.ID != "sb1" || a.Namespace != "k8s.io" || a.ShimPid != deadPid || a.ShimAlive ||
		a.QEMUPid != qemuPid || !a.QEMUAlive || a.Phase != state.PhaseCreating ||
		a.Resources[state.KindDir] != 2 || a.Resources[state.KindProcess] != 1 || a.AgeSeconds < 0 {
		t.Fatalf("sb1 = %+v", a)
	}
	if b.ID != "sb2" || b.ShimPid != os.Getpid() || !b.ShimAlive || b.QEMUPid != 0 || len(b.Resources) != 0 {
		t.Fatalf("sb2 = %+v", b)
	}

	code, out, _ = runHull(t, "ps", "--root", root)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!strings.Contains(lines[1], itoa(deadPid)+" (dead)") || !strings.Contains(lines[1], itoa(qemuPid)+" (alive)") ||
		!strings.Contains(lines[1], "dir=2 process=1") {
		t.Fatalf("ps table:\n%s", out)
	}
}

func TestPsEmptyRoot(t *testing.T) {
	code, out, _ := runHull(t, "ps", "--root", filepath.Join(t.TempDir(), "none"), "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("exit %d: %q", code, out)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// A shim that runs but whose sandbox task containerd deleted (its bundle
// is gone) is an orphan: gc kills it and releases the sandbox. One whose
// bundle is there is left alone.
func TestGCShimAliveBundleGone(t *testing.T) {
	root := t.TempDir()
	store := &state.Store{Root: root}
	bundle := filepath.Join(t.TempDir(), "bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	pidA, startA := liveSleep(t)
	pidB, startB := liveSleep(t)
	for _, sb := range []state.Sandbox{
		{ID: "kept", ShimPid: pidA, ShimStartTime: startA, Bundle: bundle},
		{ID: "orphan", ShimPid: pidB, ShimStartTime: startB, Bundle: filepath.Join(bundle, "gone")},
	} {
		h, err := store.Create(sb.ID, sb)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
	code, out, errOut := runHull(t, "gc", "--root", root)
	if code != 0 || !strings.Contains(out, "killed shim "+strconv.Itoa(pidB)) || !strings.Contains(out, "removed sandbox orphan") {
		t.Fatalf("gc: exit %d\n%s%s", code, out, errOut)
	}
	if state.ProcessAlive(pidB, startB) {
		t.Error("the orphan's shim still runs")
	}
	if !state.ProcessAlive(pidA, startA) {
		t.Error("gc killed the shim of a sandbox containerd still knows")
	}
	list, _ := store.List()
	if len(list) != 1 || list[0].ID != "kept" {
		t.Fatalf("left after gc: %+v", list)
	}
	if code, out, _ := runHull(t, "gc", "--root", root); code != 0 || strings.TrimSpace(out) != "nothing to collect" {
		t.Fatalf("second gc: exit %d\n%s", code, out)
	}
}
