// Package e2e runs Hull's binaries against real QEMU VMs.
//
// Prerequisites (`make test` provides them all): root, qemu-system-x86_64,
// and the built artefacts named by HULL_BIN, HULL_TEST_KERNEL,
// HULL_TEST_INITRD and HULL_TEST_ROOTFS. Without them the tests skip and
// say why; with HULL_E2E=1 a missing prerequisite fails them instead.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/testenv"
)

type env struct {
	hull, kernel, initrd, rootfs string
}

var testEnv env

// prerequisites returns why the end-to-end tests cannot run, or "".
func prerequisites() string {
	if os.Geteuid() != 0 {
		return "needs root (run `make test` as root)"
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "needs qemu-system-x86_64 (apt-get install qemu-system-x86)"
	}
	testEnv = env{
		hull:   os.Getenv("HULL_BIN"),
		kernel: os.Getenv("HULL_TEST_KERNEL"),
		initrd: os.Getenv("HULL_TEST_INITRD"),
		rootfs: os.Getenv("HULL_TEST_ROOTFS"),
	}
	for name, v := range map[string]string{
		"HULL_BIN": testEnv.hull, "HULL_TEST_KERNEL": testEnv.kernel,
		"HULL_TEST_INITRD": testEnv.initrd, "HULL_TEST_ROOTFS": testEnv.rootfs,
	} {
		if v == "" {
			return fmt.Sprintf("needs %s (set by `make test`)", name)
		}
		if _, err := os.Stat(v); err != nil {
			return fmt.Sprintf("%s: %v", name, err)
		}
	}
	return ""
}

var skipReason string

func TestMain(m *testing.M) {
	skipReason = prerequisites()
	os.Exit(m.Run())
}

// requireE2E skips a test whose prerequisites are missing, or fails it
// under HULL_E2E=1 (internal/testenv's one rule).
func requireE2E(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		testenv.Require(t, "end-to-end test: "+skipReason)
	}
}

// hullRun is one `hull run` invocation of a test.
type hullRun struct {
	t      *testing.T
	runDir string
	cmd    *exec.Cmd
	stdout bytes.Buffer
	stderr bytes.Buffer
}

// newRun prepares `hull run` with the test's assets and a run directory of
// the test's own, checked for leaks when the test ends.
func newRun(t *testing.T, args ...string) *hullRun {
	t.Helper()
	requireE2E(t)
	runDir := filepath.Join(t.TempDir(), "run")
	leakcheck.Register(t, runDir)
	full := []string{"run", "--run-dir", runDir,
		"--kernel", testEnv.kernel, "--initrd", testEnv.initrd}
	full = append(full, args...)
	cmd := exec.Command(testEnv.hull, full...)
	r := &hullRun{t: t, runDir: runDir, cmd: cmd}
	cmd.Stdout = &r.stdout
	cmd.Stderr = &r.stderr
	// A test that failed before its run ended stops it, as a user's
	// Ctrl-C would, before the leak check (cleanups run last first).
	t.Cleanup(func() {
		if cmd.Process != nil && cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			r.wait(time.Minute)
		}
	})
	return r
}

// exitCode runs to completion (bounded) and returns the exit status.
func (r *hullRun) exitCode() int {
	r.t.Helper()
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting hull: %v", err)
	}
	return r.wait(2 * time.Minute)
}

func (r *hullRun) wait(limit time.Duration) int {
	r.t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			r.t.Fatalf("hull run: %v", err)
		}
		return 0
	case <-time.After(limit):
		r.cmd.Process.Kill()
		<-done
		r.t.Fatalf("hull run did not finish within %v; stderr:\n%s", limit, r.stderr.String())
		return -1
	}
}

// waitForOutput waits until stdout read through pr contains want.
func waitForOutput(t *testing.T, pr io.Reader, want string, limit time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	got := make(chan string, 1)
	go func() {
		var acc []byte
		buf := make([]byte, 4096)
		for {
			n, err := pr.Read(buf)
			acc = append(acc, buf[:n]...)
			if strings.Contains(string(acc), want) || err != nil {
				got <- string(acc)
				return
			}
		}
	}()
	select {
	case s := <-got:
		if !strings.Contains(s, want) {
			t.Fatalf("output ended without %q: %q", want, s)
		}
		return s
	case <-ctx.Done():
		t.Fatalf("no %q on the output within %v", want, limit)
		return ""
	}
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// qemuOf lists the QEMU processes of a run directory.
func qemuOf(runDir string) []leakcheck.Process {
	var out []leakcheck.Process
	for _, p := range leakcheck.Processes([]string{runDir}) {
		if leakcheck.IsQEMU(p.Cmdline) {
			out = append(out, p)
		}
	}
	return out
}

// commandStderr drops hull's own log lines (such as the TCG fallback
// warning) from a run's stderr, leaving the command's.
func commandStderr(s string) string {
	var keep []string
	for _, l := range strings.SplitAfter(s, "\n") {
		if !strings.HasPrefix(l, "level=") && l != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "")
}
