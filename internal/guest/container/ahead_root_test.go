package container

import (
	"os"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// nsSharing says, for each namespace, whether the process pid shares it
// with this one (the agent).
func nsSharing(t *testing.T, pid int) string {
	t.Helper()
	var out []string
	for _, ns := range []string{"mnt", "pid", "uts", "ipc", "cgroup", "net"} {
		self, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		its, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ns+"="+strconv.FormatBool(self == its))
	}
	return strings.Join(out, " ")
}

// A container whose init is the helper started ahead is the container a
// newly started helper makes: the same namespaces (new ones where the spec
// asks, the agent's otherwise; checked from outside while it waits to
// start), cgroup, pid, capabilities, no_new_privs, seccomp, user, umask,
// oom_score_adj and hostname, seen from inside.
func TestHelperAheadAsStarted(t *testing.T) {
	e := setup(t)
	e.applets("grep", "readlink", "id")
	probe := `grep -E "^(Cap|NoNewPrivs|Seccomp:)" /proc/self/status; cat /proc/self/cgroup; echo pid=$$; hostname; umask; cat /proc/self/oom_score_adj; id`
	adj, umask := 321, uint32(0o027)
	specs := map[string]func(*specs.Spec){
		"root": func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
		},
		"confined": func(s *specs.Spec) {
			s.Linux.Namespaces = []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.MountNamespace}, {Type: specs.CgroupNamespace}}
			s.Process.User = specs.User{UID: 1000, GID: 1000, AdditionalGids: []uint32{5}, Umask: &umask}
			s.Process.Capabilities = &specs.LinuxCapabilities{
				Bounding: []string{"CAP_KILL", "CAP_NET_ADMIN"}, Effective: []string{"CAP_KILL"},
				Permitted: []string{"CAP_KILL", "CAP_NET_ADMIN"}, Inheritable: []string{"CAP_NET_ADMIN"},
				Ambient: []string{"CAP_NET_ADMIN"},
			}
			s.Process.NoNewPrivileges = true
			s.Process.OOMScoreAdj = &adj
			s.Linux.Seccomp = readDefaultProfile(t)
		},
	}
	for name, edit := range specs {
		var got [2]string
		for i, ahead := range []bool{true, false} {
			id := name + "-" + strconv.FormatBool(ahead)
			if !ahead {
				e.m.DiscardAhead()
			} else if err := e.m.startAhead(); err != nil {
				t.Fatal(err)
			}
			want := 0
			if ahead {
				want = e.m.ahead.pid
			}
			pid, err := e.m.Create(ctx(t), id, e.specWith(false, edit, "sh", "-c", probe), nil, false)
			if err != nil {
				t.Fatalf("%s: %v", id, err)
			}
			if ahead && (pid != want || e.m.ahead != nil) {
				t.Fatalf("%s: init %d, helper started ahead %d (still held: %v)", id, pid, want, e.m.ahead != nil)
			}
			sharing := nsSharing(t, pid)
			// its cgroup, seen from outside its cgroup namespace
			cg, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(cg), "0::"+strings.TrimPrefix(e.cgRoot, v2Root(t))+"/"+id+"\n") {
				t.Errorf("%s: init %d in cgroup %q, want %s/%s", id, pid, cg, e.cgRoot, id)
			}
			if err := e.m.Start(ctx(t), id); err != nil {
				t.Fatal(err)
			}
			out := waitOutput(t, e, id)
			got[i] = sharing + "\n" + strings.ReplaceAll(out, id, "<id>")
			if !strings.Contains(out, "pid=1\n") || !strings.Contains(out, "\n0::/\n") {
				t.Errorf("%s: not pid 1 at the root of its cgroup namespace:\n%s", id, got[i])
			}
		}
		if got[0] != got[1] {
			t.Errorf("%s: started ahead\n%s\nstarted for it\n%s", name, got[0], got[1])
		}
		t.Logf("%s:\n%s", name, got[0])
	}
}

// The helper started ahead is taken only by a container it can become;
// one that has exited is not used, and the container gets a new helper.
func TestHelperAheadTakenOnlyWhenItFits(t *testing.T) {
	e := setup(t)
	h := e.m.ahead
	// A terminal, and a pod's pid namespace, leave it waiting.
	if _, err := e.m.Create(ctx(t), "tty", e.spec(true, "true"), nil, false); err != nil {
		t.Fatal(err)
	}
	pod := e.specWith(false, func(s *specs.Spec) {
		var ns []specs.LinuxNamespace
		for _, n := range s.Linux.Namespaces {
			if n.Type != specs.PIDNamespace {
				ns = append(ns, n)
			}
		}
		s.Linux.Namespaces = ns
	}, "true")
	if _, err := e.m.Create(ctx(t), "nopid", pod, nil, false); err != nil {
		t.Fatal(err)
	}
	if e.m.ahead != h {
		t.Fatalf("helper started ahead taken by a container it cannot become")
	}
	// Killed while it waits: the next container starts a helper of its own.
	unix.Kill(h.pid, unix.SIGKILL)
	// the reaper collects it; wait until /proc says so
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(h.pid)); err != nil {
			break
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 10e6}, nil)
	}
	pid, err := e.m.Create(ctx(t), "after", e.spec(false, "true"), nil, false)
	if err != nil {
		t.Fatal(err)
	}
	if pid == h.pid || e.m.ahead != nil {
		t.Errorf("container init %d, dead helper %d, still held %v", pid, h.pid, e.m.ahead != nil)
	}
}
