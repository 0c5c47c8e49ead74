package container

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

// secSpec is e.spec changed by edit.
func (e *env) secSpec(t *testing.T, edit func(*specs.Spec), args ...string) []byte {
	t.Helper()
	var s specs.Spec
	if err := json.Unmarshal(e.spec(false, args...), &s); err != nil {
		t.Fatal(err)
	}
	edit(&s)
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func linkApplets(t *testing.T, e *env, applets ...string) {
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(e.rootfs, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
}

// output runs a container to its end and returns its stdout and stderr.
func output(t *testing.T, e *env, id string, spec []byte) string {
	t.Helper()
	p := run(t, e, id, spec, false)
	out := readStream(t, e, id, "", false) + readStream(t, e, id, "", true)
	if ex, _ := p.Wait(ctx(t)); ex.Status != 0 {
		t.Fatalf("%s exit %+v, output %q", id, ex, out)
	}
	return out
}

func statusLines(out, prefix string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func TestCapabilitiesApplied(t *testing.T) {
	e := setup(t)
	linkApplets(t, e, "grep")
	// As root, execve makes permitted and effective the bounding set.
	root := e.secSpec(t, func(s *specs.Spec) {
		s.Process.Capabilities = &specs.LinuxCapabilities{
			Bounding: []string{"CAP_CHOWN", "CAP_KILL"}, Effective: []string{"CAP_CHOWN", "CAP_KILL"},
			Permitted: []string{"CAP_CHOWN", "CAP_KILL"},
		}
	}, "grep", "^Cap", "/proc/self/status")
	want := "CapInh:\t0000000000000000\nCapPrm:\t0000000000000021\nCapEff:\t0000000000000021\nCapBnd:\t0000000000000021\nCapAmb:\t0000000000000000"
	if got := statusLines(output(t, e, "root", root), "Cap"); got != want {
		t.Errorf("root capabilities:\n%s\nwant\n%s", got, want)
	}
	// As uid 1000 only the ambient set survives execve: it shows that
	// inheritable, permitted and ambient were set after the uid change.
	user := e.secSpec(t, func(s *specs.Spec) {
		s.Process.User = specs.User{UID: 1000, GID: 1000}
		s.Process.Capabilities = &specs.LinuxCapabilities{
			Bounding: []string{"CAP_KILL", "CAP_NET_ADMIN"}, Effective: []string{"CAP_KILL"},
			Permitted: []string{"CAP_KILL", "CAP_NET_ADMIN"}, Inheritable: []string{"CAP_NET_ADMIN"},
			Ambient: []string{"CAP_NET_ADMIN"},
		}
	}, "grep", "^Cap", "/proc/self/status")
	want = "CapInh:\t0000000000001000\nCapPrm:\t0000000000001000\nCapEff:\t0000000000001000\nCapBnd:\t0000000000001020\nCapAmb:\t0000000000001000"
	if got := statusLines(output(t, e, "user", user), "Cap"); got != want {
		t.Errorf("uid 1000 capabilities:\n%s\nwant\n%s", got, want)
	}
	bad := e.secSpec(t, func(s *specs.Spec) {
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_KILL", "CAP_TELEPORT"}}
	}, "true")
	_, err := e.m.Create(ctx(t), "bad", bad, nil, false)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"CAP_TELEPORT"`) {
		t.Errorf("unknown capability: %v", err)
	}
}

func TestNoNewPrivsUmaskOOM(t *testing.T) {
	e := setup(t)
	linkApplets(t, e, "grep")
	adj := 503
	umask := uint32(0o027)
	spec := e.secSpec(t, func(s *specs.Spec) {
		s.Process.NoNewPrivileges = true
		s.Process.OOMScoreAdj = &adj
		s.Process.User.Umask = &umask
		s.Process.ApparmorProfile = "runtime/default"
	}, "sh", "-c", "grep NoNewPrivs /proc/self/status; cat /proc/self/oom_score_adj; umask")
	if got, want := output(t, e, "nnp", spec), "NoNewPrivs:\t1\n503\n0027\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Unset: no no_new_privs, runc's umask 0022.
	spec = e.secSpec(t, func(s *specs.Spec) {}, "sh", "-c", "grep NoNewPrivs /proc/self/status; umask")
	if got, want := output(t, e, "plain", spec), "NoNewPrivs:\t0\n0022\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func readDefaultProfile(t *testing.T) *specs.LinuxSeccomp {
	data, err := os.ReadFile("../seccomp/testdata/containerd-default.json")
	if err != nil {
		t.Fatal(err)
	}
	var s specs.LinuxSeccomp
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// TestSeccompBlocks runs containerd's default profile with no_new_privs on
// (filter loaded last) and off (loaded before the capabilities drop): the
// process is filtered, unshare fails with EPERM, and an exec process gets
// the container's filter too.
func TestSeccompBlocks(t *testing.T) {
	e := setup(t)
	linkApplets(t, e, "grep", "unshare")
	probe := "grep ^Seccomp: /proc/self/status; unshare -u true 2>/dev/null; echo unshare=$?"
	for _, nnp := range []bool{true, false} {
		id := "nnp"
		if !nnp {
			id = "privs"
		}
		spec := e.secSpec(t, func(s *specs.Spec) {
			s.Process.NoNewPrivileges = nnp
			s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_SYS_ADMIN"}, Effective: []string{"CAP_SYS_ADMIN"}, Permitted: []string{"CAP_SYS_ADMIN"}}
			s.Linux.Seccomp = readDefaultProfile(t)
		}, "sh", "-c", probe+"; sleep 1000")
		p := run(t, e, id, spec, false)
		// The init's output, read before it is killed.
		var initOut []byte
		for !bytes.Contains(initOut, []byte("unshare=")) {
			data, eof, err := p.Stdout.Read(ctx(t), 0)
			if err != nil || eof {
				t.Fatalf("%s init output %q: %v eof=%v", id, initOut, err, eof)
			}
			initOut = append(initOut, data...)
		}
		if got, want := string(initOut), "Seccomp:\t2\nunshare=1\n"; got != want {
			t.Errorf("%s init: got %q, want %q", id, got, want)
		}
		proc, _ := json.Marshal(specs.Process{Args: []string{"sh", "-c", probe}, Env: []string{"PATH=/bin"}, Cwd: "/"})
		if _, err := e.m.Exec(ctx(t), id, "x", proc, false); err != nil {
			t.Fatal(err)
		}
		if got, want := readStream(t, e, id, "x", false), "Seccomp:\t2\nunshare=1\n"; got != want {
			t.Errorf("%s exec: got %q, want %q", id, got, want)
		}
		e.m.Signal(id, "", 9, false)
		p.Wait(ctx(t))
	}
	// Without a profile unshare works (the process has CAP_SYS_ADMIN).
	spec := e.secSpec(t, func(s *specs.Spec) {}, "sh", "-c", probe)
	if got, want := output(t, e, "unconfined", spec), "Seccomp:\t0\nunshare=0\n"; got != want {
		t.Errorf("unconfined: got %q, want %q", got, want)
	}
	notify := e.secSpec(t, func(s *specs.Spec) {
		s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"mount"}, Action: specs.ActNotify}}}
	}, "true")
	if _, err := e.m.Create(ctx(t), "notify", notify, nil, false); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "SCMP_ACT_NOTIFY") {
		t.Errorf("notify: %v", err)
	}
}

func TestSysctl(t *testing.T) {
	e := setup(t)
	before, _ := os.ReadFile("/proc/sys/kernel/shm_rmid_forced")
	spec := e.secSpec(t, func(s *specs.Spec) {
		s.Linux.Sysctl = map[string]string{"kernel.shm_rmid_forced": "1", "kernel.msgmax": "4096"}
	}, "cat", "/proc/sys/kernel/shm_rmid_forced", "/proc/sys/kernel/msgmax")
	if got := output(t, e, "sysctl", spec); got != "1\n4096\n" {
		t.Errorf("in the container: %q", got)
	}
	if after, _ := os.ReadFile("/proc/sys/kernel/shm_rmid_forced"); string(after) != string(before) {
		t.Errorf("the host's value changed: %q -> %q", before, after)
	}
	for key, want := range map[string]string{"kernel.pid_max": "not in a separate kernel namespace", "net.ipv4.ip_forward": "network namespace"} {
		bad := e.secSpec(t, func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{key: "1"} }, "true")
		_, err := e.m.Create(ctx(t), "bad", bad, nil, false)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), `"`+key+`"`) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", key, err)
		}
	}
}

// TestSignalsDefault: the agent ignores the signals it does not use; a
// container process still gets the default actions.
func TestSignalsDefault(t *testing.T) {
	e := setup(t)
	linkApplets(t, e, "grep")
	signal.Ignore(unix.SIGTERM, unix.SIGHUP, unix.SIGINT, unix.SIGUSR1)
	defer signal.Reset(unix.SIGTERM, unix.SIGHUP, unix.SIGINT, unix.SIGUSR1)
	spec := e.secSpec(t, func(s *specs.Spec) {}, "grep", "^SigIgn", "/proc/self/status")
	if got, want := output(t, e, "sig", spec), "SigIgn:\t0000000000000000\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
