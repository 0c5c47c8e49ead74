// Package cri runs pods through a real containerd (Debian's 1.6.20) over
// CRI, as kubelet does: first with runc, which proves the harness, then
// with Hull's shim (runtime handler "hull").
//
// Prerequisites (`make test` provides them all): root, containerd, ctr,
// runc, the CNI plugins in /usr/lib/cni, ip and nsenter, a static
// /bin/busybox; for the hull tests also containerd-shim-hull-v2 next to
// HULL_BIN, qemu-system-x86_64, HULL_TEST_KERNEL and HULL_TEST_INITRD.
// Without them the tests skip and say why; with HULL_E2E=1 a missing
// prerequisite fails them instead.
package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

const shimName = harness.ShimName

var (
	// baseSkip says why no test here can run ("" when they can).
	baseSkip string
	// hullSkip says why the hull tests cannot run.
	hullSkip string
	shimDir  string
	kernel   string
	initrd   string
)

func basePrerequisites() string { return harness.BasePrerequisites() }

func hullPrerequisites() string {
	a, why := harness.HullAssets()
	shimDir, kernel, initrd = a.ShimDir, a.Kernel, a.Initrd
	return why
}

func TestMain(m *testing.M) {
	baseSkip = basePrerequisites()
	hullSkip = baseSkip
	if hullSkip == "" {
		hullSkip = hullPrerequisites()
	}
	os.Exit(m.Run())
}

// requireBase and requireHull skip a test whose prerequisites are
// missing, or fail it under HULL_E2E=1 (internal/testenv's one rule); a
// missing shim fails only the hull tests, so the runc tests still run.
func requireBase(t *testing.T) {
	t.Helper()
	if baseSkip != "" {
		testenv.Require(t, "CRI end-to-end test: "+baseSkip)
	}
}

func requireHull(t *testing.T) {
	t.Helper()
	requireBase(t)
	if hullSkip != "" {
		testenv.Require(t, "hull CRI end-to-end test: "+hullSkip)
	}
}

// env is one test's private containerd with its CRI client.
type env struct {
	t   *testing.T
	ctd *harness.Containerd
	cri *harness.CRI
	// hullConfig is the ConfigPath of the "hull" handler.
	hullConfig string
	// brokenKey is the key that the "hull-broken" handler's config
	// file sets to an invalid value.
	brokenKey string
	logRoot   string
}

// brokenConfig sets default_memory below its minimum (64 MiB).
const (
	brokenConfigKey   = "default_memory"
	brokenConfigValue = "1"
)

// newEnv starts a private containerd for t with the test images imported
// (in CRI's namespace and "default", for ctr), and registers its shutdown
// and leak checks as cleanups.
func newEnv(t *testing.T) *env {
	t.Helper()
	e, dir := newEnvDir(t, "hull-cri-")
	opts := harness.Options{Dir: filepath.Join(dir, "ctd")}
	if hullSkip == "" {
		e.hullConfig = filepath.Join(dir, "hull.toml")
		broken := filepath.Join(dir, "hull-broken.toml")
		writeFile(t, e.hullConfig, hullConfig())
		writeFile(t, broken, brokenHullConfig())
		e.brokenKey = brokenConfigKey
		opts.ShimDir, opts.HullConfig, opts.BrokenHullConfig = shimDir, e.hullConfig, broken
		// The same configuration with VM templates off: the cold-boot pass.
		cold := filepath.Join(dir, "hull-cold.toml")
		writeFile(t, cold, hullConfig()+"\n[factory]\nenable_template = false\n")
		opts.HullHandlers = map[string]string{handlerCold: cold}
	}
	e.ctd, e.cri = harness.LaunchT(t, opts, 60, nil, harness.CRINamespace, "default")
	return e
}

// newEnvDir is an env for t, without its containerd yet, and the test's
// directory (prefix*), removed at the end. Checked after every cleanup:
// nothing of the test may still run with the directory on its command
// line.
func newEnvDir(t *testing.T, prefix string) (*env, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	leakcheck.Register(t, dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &env{t: t, logRoot: filepath.Join(dir, "pods")}, dir
}

// hullConfig is the test's Hull configuration: the test kernel and
// initramfs, and an agent dial timeout that rides out ten TCG boots at
// once on two shared cores (the default 30 s did not: agents came up
// 17-20 s after their kernel started, and the kernels started late).
func hullConfig() string {
	return fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n\n[agent]\ndial_timeout = 120\n", kernel, initrd)
}

func brokenHullConfig() string {
	return fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n%s = %s\n", kernel, initrd, brokenConfigKey, brokenConfigValue)
}

func writeFile(t *testing.T, name, s string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ctx is a context bounded by limit, cancelled when the test ends.
func (e *env) ctx(limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	e.t.Cleanup(cancel)
	return ctx
}

// runPod runs a pod with handler and registers its removal and the check
// that nothing of it (or of its containers) remains.
func (e *env) runPod(name, handler string) *harness.Pod {
	t := e.t
	t.Helper()
	logDir := filepath.Join(e.logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := e.ctx(3 * time.Minute)
	start := time.Now()
	pod, err := e.cri.RunPod(ctx, name, handler, logDir)
	if err != nil {
		t.Fatalf("RunPodSandbox %s (handler %s): %v", name, handler, err)
	}
	t.Logf("RunPodSandbox %s (%s): %s in %v", name, handler, pod.ID, time.Since(start).Round(time.Millisecond))
	netns, _ := e.cri.PodNetns(ctx, pod.ID)
	t.Cleanup(func() {
		ids, _ := e.cri.PodContainers(context.Background(), pod.ID)
		ids = append(ids, pod.ID)
		if err := e.cri.RemovePod(e.ctx(2*time.Minute), pod.ID); err != nil {
			t.Errorf("removing pod %s at cleanup: %v", name, err)
		}
		e.checkNoResidue(ids, netns)
	})
	return pod
}

// checkNoResidue fails the test if anything of ids is left on the host.
func (e *env) checkNoResidue(ids []string, extra ...string) {
	e.t.Helper()
	for _, err := range e.ctd.Residue(10*time.Second, ids, extra...) {
		e.t.Errorf("after RemovePodSandbox: %v", err)
	}
}
