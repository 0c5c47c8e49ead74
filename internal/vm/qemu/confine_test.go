package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/fsguard"
)

// A started QEMU runs under its seccomp filter (mode 2) with a root of
// its own, not the host's /.
func TestQEMUConfined(t *testing.T) {
	q, _ := startVM(t, MachineQ35, "rdinit=/nonexistent-hull-test", "panic=0")
	pid := q.Pid()
	status, err := os.ReadFile(filepath.Join("/proc", itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
		t.Errorf("qemu pid %d is not in seccomp filter mode:\n%s", pid, grepLine(string(status), "Seccomp"))
	}
	// Two filters: internal/fsguard's, from its first instruction, and
	// QEMU's own -sandbox; no_new_privs, which the first requires.
	for _, want := range []string{"\nSeccomp_filters:\t2\n", "\nNoNewPrivs:\t1\n"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("qemu pid %d: want %q in its status:\n%s\n%s", pid, strings.TrimSpace(want),
				grepLine(string(status), "Seccomp_filters"), grepLine(string(status), "NoNewPrivs"))
		}
	}
	// The capabilities of a QEMU that would fall (internal/fsguard): the
	// four its 9p server needs, however root it runs.
	// Not root: its own user and group, no other group.
	id := itoa(int(UID(q.Config().ID)))
	for _, want := range []string{"Uid:\t" + id + "\t" + id + "\t" + id + "\t" + id, "Gid:\t" + id + "\t" + id + "\t" + id + "\t" + id, "Groups:\t"} {
		if got := grepLine(string(status), want[:strings.Index(want, ":")+1]); strings.TrimSpace(got) != strings.TrimSpace(want) {
			t.Errorf("qemu pid %d: %q, want %q", pid, got, want)
		}
	}
	for _, set := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb"} {
		if want := fmt.Sprintf("%s:\t%016x", set, fsguard.KeptMask()); grepLine(string(status), set+":") != want {
			t.Errorf("qemu pid %d: %q, want %q", pid, grepLine(string(status), set+":"), want)
		}
	}
	// Its root is its own (internal/fsguard root.go): its files at their
	// paths, its directory empty, nothing else of the host's; the
	// directory it is built on stays empty on the host.
	root := filepath.Join("/proc", itoa(pid), "root")
	if r, err := os.Stat(root + "/"); err != nil || sameAsHost(r, "/") || sameAsHost(r, q.RootDir()) {
		t.Errorf("qemu pid %d: its root is the host's / or %s (%v)", pid, q.RootDir(), err)
	}
	dir := q.Config().Dir
	if ents, err := os.ReadDir(root + dir); err != nil || len(ents) != 0 {
		t.Errorf("qemu's view of its directory %s: %v, %v; want it empty", dir, ents, err)
	}
	if cwd, err := os.Readlink(filepath.Join("/proc", itoa(pid), "cwd")); err != nil || cwd != dir {
		t.Errorf("qemu's working directory %q (%v), want %s (leakcheck finds QEMU by it)", cwd, err, dir)
	}
	for _, p := range []string{q.Config().Kernel, "/usr/bin", "/proc/self/fd"} {
		if _, err := os.Stat(root + p); err != nil {
			t.Errorf("qemu's root lacks %s: %v", p, err)
		}
	}
	for _, p := range []string{"/etc/passwd", "/root", "/home", "/var", filepath.Dir(dir) + "/host"} {
		if _, err := os.Lstat(root + p); !os.IsNotExist(err) {
			t.Errorf("qemu's root has the host's %s (%v)", p, err)
		}
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(root+"/usr", &fs); err != nil || fs.Flags&unix.ST_RDONLY == 0 {
		t.Errorf("qemu's /usr is writable (flags %#x, %v)", fs.Flags, err)
	}
	if ents, err := os.ReadDir(q.RootDir()); err != nil || len(ents) != 0 {
		t.Errorf("%s on the host: %v, %v; want it empty", q.RootDir(), ents, err)
	}
	if err := q.Stop(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(q.RootDir()); !os.IsNotExist(err) {
		t.Errorf("%s after QEMU exited: %v, want it removed", q.RootDir(), err)
	}
}

func sameAsHost(fi os.FileInfo, path string) bool {
	h, err := os.Stat(path)
	return err == nil && os.SameFile(fi, h)
}

func itoa(i int) string { return strconv.Itoa(i) }

func grepLine(text, prefix string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// QEMU does not inherit its caller's environment: containerd gives its
// shims LD_LIBRARY_PATH (its opt plugin's lib directory after an empty
// element, which the loader reads as the working directory), and a QEMU
// that inherited it searched both, and the VM's directory, for each of
// its shared libraries before the system's.
func TestQEMUEnvironmentIsItsOwn(t *testing.T) {
	t.Setenv("LD_LIBRARY_PATH", ":"+t.TempDir())
	t.Setenv("LD_PRELOAD", "/nonexistent-hull-test.so")
	t.Setenv("HULL_TEST_SECRET", "from the caller")
	q, _ := startVM(t, MachineQ35, "rdinit=/nonexistent-hull-test", "panic=0")
	b, err := os.ReadFile(filepath.Join("/proc", itoa(q.Pid()), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if strings.Join(got, " ") != strings.Join(Environment(), " ") {
		t.Errorf("qemu pid %d environment %q, want %q", q.Pid(), got, Environment())
	}
	if err := q.Stop(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
}
