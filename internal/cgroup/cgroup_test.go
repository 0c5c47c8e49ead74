package cgroup

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/mountinfo"
	"github.com/hull-runtime/hull/internal/state"
)

func TestPath(t *testing.T) {
	for _, p := range []string{"/kubepods/burstable/pod123/abc", "/hull-test/pod1/sb"} {
		if got, err := Path(p); err != nil || got != p {
			t.Errorf("Path(%q) = %q, %v", p, got, err)
		}
	}
	for p, want := range map[string]string{
		"kubepods/pod1":       "not absolute",
		"/kubepods/../../etc": "not a clean path",
		"/kubepods//pod1":     "not a clean path",
		"/":                   "root cgroup",
		"/kubepods/pod1/./x":  "not a clean path",
		"a:b:c:d":             "not absolute",
	} {
		_, err := Path(p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Path(%q) error %v, want it to mention %q", p, err, want)
		}
	}
	if got, err := Path("kubepods-burstable-pod1.slice:cri-containerd:abc"); err != nil || got != "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-abc.scope" {
		t.Errorf("systemd path: %q, %v", got, err)
	}
}

// The systemd form maps the way runc's systemd driver names the unit's
// cgroup.
func TestSystemdPath(t *testing.T) {
	for in, want := range map[string]string{
		"kubepods-burstable-pod1234.slice:cri-containerd:abcd": "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abcd.scope",
		"kubepods.slice:cri-containerd:abcd":                   "/kubepods.slice/cri-containerd-abcd.scope",
		":cri-containerd:abcd":                                 "/system.slice/cri-containerd-abcd.scope",
		"-.slice:docker:x":                                     "/docker-x.scope",
		"kubepods.slice::x":                                    "/kubepods.slice/x.scope",
		"kubepods.slice:p:child.slice":                         "/kubepods.slice/child.slice",
	} {
		if got, err := SystemdPath(in); err != nil || got != want {
			t.Errorf("SystemdPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"kubepods:p:x", "a--b.slice:p:x", "-a.slice:p:x", "a.slice:p:", "a.slice:p:x/y", "a/b.slice:p:x"} {
		if got, err := SystemdPath(in); err == nil {
			t.Errorf("SystemdPath(%q) = %q, want an error", in, got)
		}
	}
}

func TestParseMountinfo(t *testing.T) {
	const hybrid = `22 1 0:20 / /sys rw - sysfs sysfs rw
30 22 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime shared:5 - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
34 30 0:30 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
37 1 0:28 / /mnt/memory\040again rw,relatime - cgroup cgroup rw,memory
38 30 0:32 /sub /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
`
	hs, err := parse(hybrid)
	if err != nil {
		t.Fatal(err)
	}
	want := []Hierarchy{
		{Mount: "/sys/fs/cgroup/cpu", Controllers: "cpu"},
		{Mount: "/sys/fs/cgroup/memory", Controllers: "memory"},
		{Mount: "/sys/fs/cgroup/cpuset", Cpuset: true, Controllers: "cpuset"},
		{Mount: "/sys/fs/cgroup/unified", V2: true},
		{Mount: "/sys/fs/cgroup/cpu,cpuacct", Controllers: "cpu,cpuacct"},
	}
	if !reflect.DeepEqual(hs, want) {
		t.Errorf("hierarchies:\n got %+v\nwant %+v", hs, want)
	}
	if _, err := parse("22 1 0:20 / /sys rw - sysfs sysfs rw\n"); err == nil {
		t.Error("no cgroup mounts: no error")
	}
}

func parse(table string) ([]Hierarchy, error) {
	ms, err := mountinfo.Parse(strings.NewReader(table))
	if err != nil {
		return nil, err
	}
	return hierarchies(ms)
}

// On this host (root): the cgroup is created in every hierarchy, a
// process joins it, an existing cgroup is refused, and the state's
// cgroup releaser removes it once the process is gone.
func TestCreateJoinRelease(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	hs, err := Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	parent := "/hull-cgroup-test-" + filepath.Base(t.TempDir())
	rel := parent + "/pod1/sandbox"
	t.Cleanup(func() {
		for _, h := range hs {
			state.ReleaseCgroup(context.Background(), state.Resource{Kind: state.KindCgroup, Key: h.Dir(parent)})
		}
	})
	var dirs []string
	for _, h := range hs {
		if err := Create(h, rel); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, h.Dir(rel))
		if err := Create(h, rel); !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), h.Dir(rel)) {
			t.Errorf("second Create: %v, want ErrExist naming %s", err, h.Dir(rel))
		}
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := Join(dirs, cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	for _, d := range dirs {
		if in, err := Contains(d, cmd.Process.Pid); err != nil || !in {
			t.Errorf("pid %d not in %s: %v", cmd.Process.Pid, d, err)
		}
		if err := state.ReleaseCgroup(context.Background(), state.Resource{Kind: state.KindCgroup, Key: d}); err == nil {
			t.Errorf("releasing %s with a process in it: no error", d)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	for _, d := range dirs {
		if err := state.ReleaseCgroup(context.Background(), state.Resource{Kind: state.KindCgroup, Key: d}); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there after release: %v", d, err)
		}
	}
	t.Logf("hierarchies: %+v", hs)
}

func TestParseProcCgroup(t *testing.T) {
	hs := []Hierarchy{
		{Mount: "/sys/fs/cgroup/cpu", Controllers: "cpu"},
		{Mount: "/sys/fs/cgroup/memory", Controllers: "memory"},
		{Mount: "/sys/fs/cgroup/unified", V2: true},
	}
	text := "9:name=systemd:/\n4:memory:/process_api/f10\n1:cpu:/\n0::/x/y\n"
	got, err := parseProcCgroup(hs, text, 1)
	want := []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/memory/process_api/f10", "/sys/fs/cgroup/unified/x/y"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parseProcCgroup = %v, %v; want %v", got, err, want)
	}
	if _, err := parseProcCgroup(append(hs, Hierarchy{Mount: "/sys/fs/cgroup/pids", Controllers: "pids"}), text, 1); err == nil {
		t.Error("a hierarchy missing from /proc/<pid>/cgroup: no error")
	}
}
