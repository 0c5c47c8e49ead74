package container

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/testenv"
)

// pauseSetup is setup with Hull's pause (HULL_TEST_PAUSE, built by make)
// in a directory of its own, sealed as the agent seals it.
func pauseSetup(t *testing.T) *env {
	vals, why := testenv.Env("HULL_TEST_PAUSE")
	testenv.Require(t, why)
	e := setup(t)
	bin, err := os.ReadFile(vals[0])
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "hull-pause")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pauseBinary), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	e.m.cfg.PauseDir = dir
	ok, err := preparePause(dir)
	if err != nil || !ok {
		t.Fatalf("preparing the pause: %v %v", ok, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting the pause directory: %v", err)
		}
	})
	e.m.pause = true
	return e
}

// sandboxSpec is a CRI sandbox's spec: the image's command (which Hull's
// pause replaces), a user, an oom_score_adj and every capability. (Kubelet
// asks for -998, which the agent may set; lowering it needs
// CAP_SYS_RESOURCE, which a test host's root may lack.)
func (e *env) sandboxSpec(t *testing.T, user specs.User) []byte {
	adj := 998
	return e.specWith(false, func(s *specs.Spec) {
		inPod("sb", "sandbox", &specs.LinuxNamespace{Type: specs.PIDNamespace})(s)
		s.Process.User = user
		s.Process.OOMScoreAdj = &adj
	}, "sleep", "1000")
}

// procStatus returns the named fields of /proc/PID/status.
func procStatus(t *testing.T, pid int, names ...string) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && slices.Contains(names, k) {
			got[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return got
}

// A CRI sandbox runs Hull's pause, not its image's command: as the spec's
// user, with no capability in any set and no_new_privs, the spec's
// oom_score_adj, in new mount, pid, ipc and uts namespaces whose root is
// the pause's directory and nothing else. Exec into it is refused; SIGTERM
// ends it with 0, as Kubernetes' pause.
func TestSandboxRunsHullsPause(t *testing.T) {
	e := pauseSetup(t)
	pid, err := e.m.Create(ctx(t), "sb", e.sandboxSpec(t, specs.User{UID: 65534, GID: 65533, AdditionalGids: []uint32{5, 7}}), nil, false)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if got := strings.ReplaceAll(string(cmdline), "\x00", " "); got != "/pause 65534 65533 5 7 " {
		t.Errorf("sandbox runs %q, want Hull's pause", got)
	}
	// The pause is ready when Create returns: everything is dropped.
	want := map[string]string{
		"Uid": "65534 65534 65534 65534", "Gid": "65533 65533 65533 65533", "Groups": "5 7",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	}
	var names []string
	for k := range want {
		names = append(names, k)
	}
	if got := procStatus(t, pid, names...); !maps.Equal(got, want) {
		t.Errorf("pause status %v, want %v", got, want)
	}
	if adj, _ := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid)); strings.TrimSpace(string(adj)) != "998" {
		t.Errorf("oom_score_adj %q, want 998", adj)
	}
	for _, ns := range []string{"mnt", "pid", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		its, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if its == "" || its == mine {
			t.Errorf("pause's %s namespace %q, the agent's %q: want a new one", ns, its, mine)
		}
	}
	// Its mount namespace holds one mount, the read-only pause directory.
	mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	lines := strings.Split(strings.TrimSpace(string(mi)), "\n")
	if len(lines) != 1 || strings.Fields(lines[0])[4] != "/" || !strings.Contains(strings.Fields(lines[0])[5], "ro") {
		t.Errorf("pause's mounts:\n%s", mi)
	}
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/root", pid))
	if len(ents) != 1 || ents[0].Name() != "pause" {
		t.Errorf("pause's root holds %v, want the pause only", ents)
	}

	if err := e.m.Start(ctx(t), "sb"); err != nil {
		t.Fatalf("start: %v", err)
	}
	if _, err := e.m.Exec(ctx(t), "sb", "x", []byte(`{"args":["true"],"cwd":"/"}`), false); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "Hull's pause") {
		t.Errorf("exec into the pause: %v", err)
	}
	if err := e.m.Signal("sb", "", unix.SIGTERM, false); err != nil {
		t.Fatal(err)
	}
	p, _ := e.m.Process("sb", "")
	if ex, err := p.Wait(ctx(t)); err != nil || ex.Status != 0 || ex.Signal != 0 {
		t.Fatalf("pause after SIGTERM: %+v %v, want exit 0", ex, err)
	}
	if err := e.m.Remove(ctx(t), "sb", false); err != nil {
		t.Fatal(err)
	}
}

// The attack: a root container with every capability, in a pod sharing
// the sandbox's pid namespace, reaches for the guest through PID 1 (its
// root, its mount namespace) and finds only the read-only pause; it cannot
// end the pause with SIGTERM or SIGINT (the agent can); the pause reaps
// the pod's orphans. The app's shell stays (a sleep, its output closed)
// while the orphan is looked at: once a pod container's init exits, what
// it left behind is killed with it.
func TestPauseHoldsNothingOfTheGuest(t *testing.T) {
	e := pauseSetup(t)
	e.applets("kill", "tr", "nsenter", "touch", "wc")
	sb := run(t, e, "sb", e.sandboxSpec(t, specs.User{}), false)
	// Root keeps no capability either.
	caps := procStatus(t, sb.Pid, "CapPrm", "CapEff", "CapBnd")
	for k, v := range caps {
		if v != "0000000000000000" {
			t.Errorf("a root pause's %s is %s", k, v)
		}
	}
	script := strings.Join([]string{
		`tr '\0' ' ' < /proc/1/cmdline; echo`,
		`ls -a /proc/1/root/ | tr '\n' ' '; echo`,
		`touch /proc/1/root/x 2>/dev/null && echo wrote || echo refused`,
		`wc -l < /proc/1/mountinfo`,
		// In its mount namespace there is nothing to run.
		`nsenter -t 1 -m ls / >/dev/null 2>&1 && echo reached || echo nothing`,
		`sh -c 'sleep 1000 <&- >&- 2>&- & exit 0'`, // an orphan for PID 1
		`kill -TERM 1; kill -INT 1; echo survived`,
		`exec sleep 1000 <&- >&- 2>&-`,
	}, "; ")
	pod := &specs.LinuxNamespace{Type: specs.PIDNamespace, Path: "/proc/4242/ns/pid"}
	run(t, e, "app", e.specWith(false, inPod("sb", "container", pod), "sh", "-c", script), false)
	out := strings.Split(readStream(t, e, "app", "", false), "\n")
	want := []string{"/pause 0 0 ", ". .. pause ", "refused", "1", "nothing", "survived"}
	if len(out) < len(want) || !slices.Equal(out[:len(want)], want) {
		t.Fatalf("from the pod's container:\n%s\nwant:\n%s", strings.Join(out, "\n"), strings.Join(want, "\n"))
	}
	if sb.Exited() {
		t.Fatal("the pause died")
	}
	// The orphan's parent is the pause, which reaps it once killed.
	app, err := e.m.Process("app", "")
	if err != nil {
		t.Fatal(err)
	}
	pids, err := e.m.Pids("app")
	if err != nil || len(pids) != 2 {
		t.Fatalf("the app's processes: %v %v, want its init and the orphan", pids, err)
	}
	orphan := pids[0]
	if orphan == app.Pid {
		orphan = pids[1]
	}
	if ppid := procStatus(t, orphan, "PPid")["PPid"]; ppid != fmt.Sprint(sb.Pid) {
		t.Fatalf("orphan's parent %s, want the pause (%d)", ppid, sb.Pid)
	}
	unix.Kill(orphan, unix.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", orphan)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped: %v", orphan, procStatus(t, orphan, "State"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := e.m.Remove(ctx(t), "app", true); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Remove(ctx(t), "sb", true); err != nil {
		t.Fatal(err)
	}
}

// A pause that cannot become the spec's user fails Create with its
// reason and leaves nothing; one removed before it started ends.
func TestPauseFailuresLeaveNothing(t *testing.T) {
	e := pauseSetup(t)
	_, err := e.m.Create(ctx(t), "bad", e.sandboxSpec(t, specs.User{UID: 4294967295}), nil, false)
	if err == nil || !strings.Contains(err.Error(), "pause: user: Invalid argument") {
		t.Fatalf("create with uid 4294967295: %v", err)
	}
	if ids := e.m.IDs(); len(ids) != 0 {
		t.Errorf("containers left: %v", ids)
	}
	if _, err := os.Stat(filepath.Join(e.cgRoot, "bad")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup of the failed sandbox: %v", err)
	}
	if _, err := e.m.Create(ctx(t), "sb", e.sandboxSpec(t, specs.User{}), nil, false); err != nil {
		t.Fatal(err)
	}
	p, _ := e.m.Process("sb", "")
	if err := e.m.Remove(ctx(t), "sb", false); err != nil {
		t.Fatalf("removing a created pause: %v", err)
	}
	if !p.Exited() {
		t.Error("removed pause still running")
	}
}
