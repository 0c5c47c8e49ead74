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

	"github.com/hull-runtime/hull/internal/fsguard"
)

// A started QEMU runs under its seccomp filter (mode 2) with its root in
// the empty chroot directory, not the host's /.
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
	// five its 9p server and -chroot need, however root it runs.
	for _, set := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if want := fmt.Sprintf("%s:\t%016x", set, fsguard.KeptMask()); grepLine(string(status), set+":") != want {
			t.Errorf("qemu pid %d: %q, want %q", pid, grepLine(string(status), set+":"), want)
		}
	}
	root, err := os.Stat(filepath.Join("/proc", itoa(pid), "root") + "/")
	if err != nil {
		t.Fatal(err)
	}
	hostRoot, _ := os.Stat("/")
	want, err := os.Stat(q.ChrootDir())
	if err != nil {
		t.Fatal(err)
	}
	if os.SameFile(root, hostRoot) {
		t.Errorf("qemu pid %d has the host's / as its root", pid)
	}
	if !os.SameFile(root, want) {
		r := root.Sys().(*syscall.Stat_t)
		t.Errorf("qemu's root is dev %d ino %d, not %s", r.Dev, r.Ino, q.ChrootDir())
	}
	// Its root holds only proc/self/fd, which shows QEMU's own descriptors.
	ents, err := os.ReadDir(q.ChrootDir())
	if err != nil || len(ents) != 1 || ents[0].Name() != "proc" {
		t.Errorf("chroot directory %s: %v, %v; want only proc", q.ChrootDir(), ents, err)
	}
	fds, err := os.ReadDir(q.ProcFDMount())
	own, _ := os.ReadDir(filepath.Join("/proc", itoa(pid), "fd"))
	if err != nil || len(fds) == 0 || len(fds) != len(own) {
		t.Errorf("%s: %d entries, %v; want QEMU's %d descriptors", q.ProcFDMount(), len(fds), err, len(own))
	}
	if err := q.Stop(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if mounted(t, q.ProcFDMount()) {
		t.Errorf("%s still mounted after QEMU exited", q.ProcFDMount())
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func mounted(t *testing.T, path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

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
