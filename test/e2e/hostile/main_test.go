// Package hostile is the red-team suite of issue 10: pods driven through
// a real containerd over CRI, as kubelet does, whose guest acts as an
// attacker would, and checks of what the host lets it do.
//
// Prerequisites are those of test/e2e/cri (root, containerd, CNI, QEMU,
// HULL_BIN with the shim beside it, HULL_TEST_KERNEL, HULL_TEST_INITRD).
// Without them the tests skip; with HULL_E2E=1 they fail instead.
package hostile

import (
	"os"
	"testing"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

var (
	// skip says why the tests cannot run ("" when they can).
	skip   string
	assets harness.Assets
)

func TestMain(m *testing.M) {
	skip = harness.BasePrerequisites()
	if skip == "" {
		assets, skip = harness.HullAssets()
	}
	os.Exit(m.Run())
}

func requireHull(t *testing.T) {
	t.Helper()
	if skip == "" {
		return
	}
	if os.Getenv("HULL_E2E") == "1" {
		t.Fatal("hostile end-to-end test (HULL_E2E=1): " + skip)
	}
	t.Skip("hostile end-to-end test: " + skip)
}
