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
	"os"
	"testing"

	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

const shimName = harness.ShimName

var (
	// skipReason says why the tests cannot run ("" when they can).
	skipReason string
	shimDir    string
	kernel     string
	initrd     string
)

func prerequisites() string {
	if why := harness.BasePrerequisites("go"); why != "" {
		return why
	}
	a, why := harness.HullAssets()
	shimDir, kernel, initrd = a.ShimDir, a.Kernel, a.Initrd
	return why
}

func TestMain(m *testing.M) {
	skipReason = prerequisites()
	os.Exit(m.Run())
}

func requireE2E(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, "network end-to-end test: "+skipReason)
	}
}
