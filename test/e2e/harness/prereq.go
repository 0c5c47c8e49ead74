package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hull-runtime/hull/internal/testenv"
)

// ShimName is the binary containerd runs for io.containerd.hull.v2.
const ShimName = "containerd-shim-hull-v2"

// BasePrerequisites says why a containerd/CRI end-to-end test cannot run
// on this host ("" when it can): root, containerd with runc, the tools the
// harness runs, Debian's CNI plugins and a static busybox for the images.
// extraBins are more commands the caller needs on PATH.
func BasePrerequisites(extraBins ...string) string {
	if os.Geteuid() != 0 {
		return "needs root (run `make test` as root)"
	}
	v, err := SelectedVersion()
	if err != nil {
		return err.Error()
	}
	if why := v.Missing(); why != "" {
		return why
	}
	for _, bin := range append([]string{"runc", "ip", "nsenter"}, extraBins...) {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Sprintf("needs %s in PATH (make deps)", bin)
		}
	}
	for _, f := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Sprintf("needs %s (make deps: apt-get install containernetworking-plugins)", f)
		}
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		return "needs a static /bin/busybox (make deps: apt-get install busybox-static)"
	}
	return ""
}

// Assets are the built artefacts a Hull end-to-end test uses.
type Assets struct {
	Hull    string // HULL_BIN
	ShimDir string // the directory of HULL_BIN, holding the shim too
	Kernel  string // HULL_TEST_KERNEL
	Initrd  string // HULL_TEST_INITRD
}

// HullAssets reads the assets `make test` names in the environment and
// says why they are unusable ("" when they are): QEMU, HULL_BIN with the
// shim beside it, the guest kernel and initramfs.
func HullAssets() (Assets, string) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return Assets{}, "needs qemu-system-x86_64 (apt-get install qemu-system-x86)"
	}
	a := Assets{Hull: os.Getenv("HULL_BIN"), Kernel: os.Getenv("HULL_TEST_KERNEL"), Initrd: os.Getenv("HULL_TEST_INITRD")}
	for _, v := range []struct{ name, value string }{{"HULL_BIN", a.Hull}, {"HULL_TEST_KERNEL", a.Kernel}, {"HULL_TEST_INITRD", a.Initrd}} {
		if v.value == "" {
			return a, fmt.Sprintf("needs %s (set by `make test`)", v.name)
		}
		if _, err := os.Stat(v.value); err != nil {
			return a, fmt.Sprintf("%s: %v", v.name, err)
		}
	}
	a.ShimDir = filepath.Dir(a.Hull)
	if _, err := os.Stat(filepath.Join(a.ShimDir, ShimName)); err != nil {
		return a, fmt.Sprintf("needs %s next to HULL_BIN (make build): %v", ShimName, err)
	}
	return a, ""
}

// RequireHull returns the assets a test that runs Hull pods through a
// real containerd needs (BasePrerequisites and HullAssets, and any more
// reasons the caller gives), or skips the test saying why — fails it
// under HULL_E2E=1 (make test), as internal/testenv decides for every
// test of the project.
func RequireHull(t testing.TB, more ...string) Assets {
	t.Helper()
	why := BasePrerequisites()
	var a Assets
	if why == "" {
		a, why = HullAssets()
	}
	testenv.Require(t, append([]string{why}, more...)...)
	return a
}
