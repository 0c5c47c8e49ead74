package qemu

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
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
	ents, err := os.ReadDir(q.ChrootDir())
	if err != nil || len(ents) != 0 {
		t.Errorf("chroot directory %s: %d entries, %v; want empty", q.ChrootDir(), len(ents), err)
	}
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
