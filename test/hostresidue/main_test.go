package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/cgroup"
)

// What a test leaves on the host (a mount, a named network namespace, a
// cgroup, a sandbox in a Hull state root, a QEMU) is in the listing while
// it exists, and out of it once removed.
func TestListNamesWhatATestLeaves(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	name := "hull-residue-test-" + filepath.Base(t.TempDir())
	mnt := t.TempDir()
	netns := filepath.Join("/run/netns", name)
	state := filepath.Join("/run", "hull-e2e-"+filepath.Base(mnt))
	sandbox := filepath.Join(state, "sb")
	hs, err := cgroup.Hierarchies()
	if err != nil || len(hs) == 0 {
		t.Fatalf("cgroup hierarchies: %v, %d", err, len(hs))
	}
	cg := hs[0].Dir(name)

	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", name).Run() })
	if err := os.MkdirAll(sandbox, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(cg) })
	qemu := exec.Command("qemu-system-x86_64", "-machine", "none", "-display", "none", "-nodefaults", "-S")
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qemu.Process.Kill(); qemu.Wait() })

	want := []string{
		"mount " + mnt,
		"mount " + netns, // the namespace's own bind mount
		"netns " + netns,
		"state " + state,
		"state " + sandbox,
		"cgroup " + cg,
	}
	lines, err := list()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(lines, w) {
			t.Errorf("listing lacks %q", w)
		}
	}
	var sawQEMU bool
	for _, l := range lines {
		sawQEMU = sawQEMU || strings.HasPrefix(l, "process "+strconv.Itoa(qemu.Process.Pid)+" qemu-system")
	}
	if !sawQEMU {
		t.Errorf("listing lacks the QEMU started (pid %d)", qemu.Process.Pid)
	}
	// /run/netns itself is host setup (see list); a fresh machine's CI run
	// failed unit+root on it.
	if slices.Contains(lines, "mount /run/netns") {
		t.Error(`listing has "mount /run/netns", iproute2's one-time mount of the directory itself`)
	}
	if !slices.IsSorted(lines) {
		t.Error("listing is not sorted (comm(1) needs it)")
	}

	qemu.Process.Kill()
	qemu.Wait()
	unix.Unmount(mnt, unix.MNT_DETACH)
	exec.Command("ip", "netns", "delete", name).Run()
	os.RemoveAll(state)
	os.Remove(cg)
	lines, err = list()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if strings.Contains(l, name) || strings.Contains(l, state) || strings.HasPrefix(l, "mount "+mnt) ||
			strings.HasPrefix(l, "process "+strconv.Itoa(qemu.Process.Pid)+" ") {
			t.Errorf("still listed once removed: %q", l)
		}
	}
}
