package critest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// critestVersion is the cri-tools release hack/build-compat.sh builds.
const critestVersion = "1.37.0"

// focus selects the specs that need no registry and no host ports: the
// PodSandbox, Container (lifecycle, logs, mounts, OOM), Multiple
// Containers, Streaming and Security Context groups.
const focus = `\[k8s\.io\] (PodSandbox|Container|Multiple Containers|Streaming|Security Context) `

// critestBinary is HULL_CRITEST, or where hack/build-compat.sh puts it.
func critestBinary() string {
	if b := os.Getenv("HULL_CRITEST"); b != "" {
		return b
	}
	return filepath.Join(harness.CacheDir(), "critest-"+critestVersion, "bin", "critest")
}

// TestCritest runs critest's focused specs with runc and then with Hull
// on the containerd HULL_CONTAINERD selects, prints both pass counts, and
// fails on every spec that passed for runc, did not pass for Hull, and is
// not in exceptions.txt for this version. Every run ends with the leak
// checks: no pod left in CRI, nothing of the run's pods and containers on
// the host, nothing mounted under containerd's directory.
func TestCritest(t *testing.T) {
	assets := harness.RequireHull(t, testenv.Files(critestBinary()))
	version, err := harness.SelectedVersion()
	if err != nil {
		t.Fatal(err)
	}
	exc, err := readExceptions("exceptions.txt")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hull-critest-")
	if err != nil {
		t.Fatal(err)
	}
	leakcheck.Register(t, dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	tools, err := buildTools(dir)
	if err != nil {
		t.Fatal(err)
	}
	hullConfig := filepath.Join(dir, "hull.toml")
	// The agent dial timeout of the CRI suite (test/e2e/cri): TCG boots on
	// two shared cores.
	if err := os.WriteFile(hullConfig, []byte(fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n\n[agent]\ndial_timeout = 120\n", assets.Kernel, assets.Initrd)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctd, cri := harness.LaunchT(t, harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: assets.ShimDir, HullConfig: hullConfig, Version: version}, 80, nil)
	// Registered after LaunchT's cleanup, so it runs before containerd's
	// directory is removed.
	t.Cleanup(func() {
		if t.Failed() {
			keepArtifacts(t, dir, ctd.LogFile, version)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Minute)
	defer cancel()
	if err := ctd.ImportImages(ctx, "critest-images.tar", critestImages(tools), harness.CRINamespace); err != nil {
		t.Fatalf("importing critest's images: %v", err)
	}

	// runc's run and Hull's at once, on the same containerd (every spec
	// names its pods uniquely): runc's takes 1–2 min of mostly waiting,
	// which would otherwise add to Hull's (docs/e2e-critest.md).
	handlers := []string{harness.HandlerRunc, harness.HandlerHull}
	type run struct {
		res, fails map[string]string
		err        error
		took       time.Duration
	}
	runs := map[string]*run{}
	var wg sync.WaitGroup
	for _, handler := range handlers {
		r := &run{}
		runs[handler] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			r.res, r.fails, r.err = runCritest(ctx, ctd, critestBinary(), handler, dir)
			r.took = time.Since(start)
		}()
	}
	wg.Wait()
	results := map[string]map[string]string{}
	for _, handler := range handlers {
		r := runs[handler]
		if r.err != nil {
			t.Fatalf("critest with %s: %v", handler, r.err)
		}
		results[handler] = r.res
		for _, n := range sortedKeys(r.fails) {
			t.Logf("%s: %s: %s: %s", handler, r.res[n], n, r.fails[n])
		}
		ran, passed := counts(r.res)
		if ran == 0 {
			t.Fatalf("critest with %s ran none of the focused specs", handler)
		}
		t.Logf("%s, %s: %d of %d specs passed (%v)", version, handler, passed, ran, r.took.Round(time.Second))
	}
	checkNoLeftovers(t, ctx, ctd, cri, strings.Join(handlers, " and "))

	unexcused, excused, stale := verdict(results[harness.HandlerRunc], results[harness.HandlerHull], exc, version.Name)
	rr, rp := counts(results[harness.HandlerRunc])
	hr, hp := counts(results[harness.HandlerHull])
	fmt.Printf("critest %s on %s: runc passed %d of %d, hull passed %d of %d; %d passing for runc only are excepted, %d are not\n",
		critestVersion, version, rp, rr, hp, hr, len(excused), len(unexcused))
	for _, e := range excused {
		t.Logf("excepted (exceptions.txt:%d): %s: %s", e.Line, e.Spec, e.Reason)
	}
	for _, e := range stale {
		t.Logf("exceptions.txt:%d passes for hull on %s now, remove it: %s", e.Line, version, e.Spec)
	}
	for _, s := range unexcused {
		t.Errorf("passes for runc, not for hull, not in exceptions.txt: %s", s)
	}
	// The lines to paste into exceptions.txt, reasons to be written.
	if len(unexcused) > 0 {
		var lines []string
		for _, n := range sortedKeys(results[harness.HandlerRunc]) {
			if results[harness.HandlerRunc][n] == "passed" && results[harness.HandlerHull][n] != "passed" {
				lines = append(lines, version.Name+" | "+n+" | ")
			}
		}
		t.Logf("every spec passing for runc only on %s:\n%s", version, strings.Join(lines, "\n"))
	}
}

// runCritest runs critest inside containerd's network namespace (its
// streaming server listens on 127.0.0.1 there) and returns the state of
// every focused spec. critest's own output goes to a log file beside the
// report; its exit status (non-zero when a spec failed) is not an error.
func runCritest(ctx context.Context, ctd *harness.Containerd, bin, handler, dir string) (states, failures map[string]string, err error) {
	report := filepath.Join(dir, "critest-"+handler+".json")
	logFile := filepath.Join(dir, "critest-"+handler+".log")
	endpoint := "unix://" + ctd.Socket
	args := []string{"--net=" + ctd.NetnsPath, "--", bin,
		"-runtime-endpoint", endpoint, "-image-endpoint", endpoint, "-runtime-handler", handler,
		"-ginkgo.focus", focus, "-ginkgo.no-color", "-ginkgo.json-report", report, "-ginkgo.timeout", "50m"}
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	// Log directories of critest's pods land in the test's directory.
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	out, err := os.Create(logFile)
	if err != nil {
		return nil, nil, err
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	runErr := cmd.Run()
	states, failures, err = readReport(report)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (critest: %v); its output:\n%s", err, runErr, tailFile(logFile, 40))
	}
	if len(states) == 0 {
		return nil, nil, fmt.Errorf("critest ran no spec (%v); its output:\n%s", runErr, tailFile(logFile, 40))
	}
	return states, failures, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// podIDs are the sandbox and container ids containerd's log shows CRI
// returning: every pod and container critest made.
var podIDs = regexp.MustCompile(`returns (?:sandbox|container) id \\?"([0-9a-f]{64})`)

// checkNoLeftovers is the leak check after one critest run: CRI lists no
// pod (critest removes what it made, also after a failed spec), and
// nothing of any pod or container of the run is left on the host.
func checkNoLeftovers(t *testing.T, ctx context.Context, ctd *harness.Containerd, cri *harness.CRI, handler string) {
	t.Helper()
	pods, err := cri.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		t.Errorf("listing pods after critest with %s: %v", handler, err)
	}
	// A spec that fails before it records its pod's id leaves the pod
	// (critest's AfterEach removes only recorded ones; e.g. HostNetwork's
	// createAndCheckHostNetwork): removed here through CRI, which must
	// work, and then checked like every other pod below.
	for _, p := range pods.GetItems() {
		t.Logf("critest with %s left pod %s (%s), removing it", handler, p.Id, p.Metadata.GetName())
		if _, err := cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			t.Errorf("stopping pod %s that critest left: %v", p.Id, err)
		}
		if _, err := cri.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			t.Errorf("removing pod %s that critest left: %v", p.Id, err)
		}
	}
	log, err := os.ReadFile(ctd.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var ids []string
	for _, m := range podIDs.FindAllSubmatch(log, -1) {
		if id := string(m[1]); !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, err := range ctd.Residue(30*time.Second, ids) {
		t.Errorf("leak after critest with %s: %v", handler, err)
	}
}

// keepArtifacts copies critest's output and reports and containerd's log
// of a failed run to $HULL_ARTIFACTS (default /tmp)/hull-critest-<version>-<time>.
func keepArtifacts(t *testing.T, dir, containerdLog string, v harness.Version) {
	root := os.Getenv("HULL_ARTIFACTS")
	if root == "" {
		root = os.TempDir()
	}
	dst := filepath.Join(root, fmt.Sprintf("hull-critest-%s-%s", v.Name, time.Now().Format("150405")))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Logf("keeping critest's output: %v", err)
		return
	}
	files, _ := filepath.Glob(filepath.Join(dir, "critest-*"))
	for _, f := range append(files, containerdLog) {
		if b, err := os.ReadFile(f); err == nil {
			os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644)
		}
	}
	t.Logf("critest's output, reports and containerd's log kept in %s", dst)
}

func tailFile(file string, n int) string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
