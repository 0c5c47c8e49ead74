// Package podnet tests pod networking end to end (issue 4): pods of every
// internetworking model (runtime handlers hull-tcfilter, hull-macvtap,
// hull-none, and runc beside them) through CRI on a private containerd
// whose CNI network is bridge + host-local + strictcni (a plugin of this
// tree whose DEL fails unless eth0 keeps its address and the namespace is
// as ADD left it), all inside the harness's network namespace.
//
// Prerequisites are those of test/e2e/cri, plus the go command (the test
// builds strictcni). Without them the tests skip and say why; with
// HULL_E2E=1 they fail instead.
package podnet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

const shimName = "containerd-shim-hull-v2"

var (
	// skipReason says why the tests cannot run ("" when they can).
	skipReason string
	shimDir    string
	kernel     string
	initrd     string
)

func prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root (run `make test` as root)"
	}
	for _, bin := range []string{"containerd", "ctr", "runc", "containerd-shim-runc-v2", "ip", "nsenter", "go", "qemu-system-x86_64"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("needs %s in PATH (make deps)", bin)
		}
	}
	for _, f := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback", "/bin/busybox"} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Sprintf("needs %s (make deps)", f)
		}
	}
	hull := os.Getenv("HULL_BIN")
	kernel, initrd = os.Getenv("HULL_TEST_KERNEL"), os.Getenv("HULL_TEST_INITRD")
	for name, v := range map[string]string{"HULL_BIN": hull, "HULL_TEST_KERNEL": kernel, "HULL_TEST_INITRD": initrd} {
		if v == "" {
			return fmt.Sprintf("needs %s (set by `make test`)", name)
		}
		if _, err := os.Stat(v); err != nil {
			return fmt.Sprintf("%s: %v", name, err)
		}
	}
	shimDir = filepath.Dir(hull)
	if _, err := os.Stat(filepath.Join(shimDir, shimName)); err != nil {
		return fmt.Sprintf("needs %s next to HULL_BIN (make build): %v", shimName, err)
	}
	return ""
}

func TestMain(m *testing.M) {
	skipReason = prerequisites()
	os.Exit(m.Run())
}

func requireE2E(t *testing.T) {
	t.Helper()
	if skipReason == "" {
		return
	}
	if os.Getenv("HULL_E2E") == "1" {
		t.Fatal("network end-to-end test (HULL_E2E=1): " + skipReason)
	}
	t.Skip("network end-to-end test: " + skipReason)
}
