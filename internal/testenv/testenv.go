// Package testenv decides, in one place, what a test does when something
// it needs is missing on this host: skip and say how to enable it, or —
// under HULL_E2E=1, which `make test` (and so CI) sets — fail, because a
// suite whose tests all skipped proves nothing.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// Strict reports whether a missing prerequisite is a failure (HULL_E2E=1).
func Strict() bool { return os.Getenv("HULL_E2E") == "1" }

// Require skips t, or fails it under HULL_E2E=1, with the first non-empty
// reason; it does nothing when every reason is "" (all is there).
func Require(t testing.TB, reasons ...string) {
	t.Helper()
	for _, r := range reasons {
		if r == "" {
			continue
		}
		if Strict() {
			t.Fatalf("HULL_E2E=1 but this test cannot run: %s", r)
		}
		t.Skip(r)
	}
}

// Root is "" when the test runs as root, else why it needs to.
func Root(why string) string {
	if os.Geteuid() == 0 {
		return ""
	}
	return fmt.Sprintf("needs root (%s): run `make test` as root", why)
}

// Bins is "" when every named command is on PATH, else the first missing.
func Bins(names ...string) string {
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			return fmt.Sprintf("needs %s in PATH (make deps)", n)
		}
	}
	return ""
}

// Files is "" when every named file exists, else the first missing.
func Files(paths ...string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return fmt.Sprintf("needs %s: %v", p, err)
		}
	}
	return ""
}

// Env returns the value of each named environment variable, and a reason
// naming the first one unset.
func Env(names ...string) ([]string, string) {
	vals := make([]string, len(names))
	for i, n := range names {
		vals[i] = os.Getenv(n)
		if vals[i] == "" {
			return vals, fmt.Sprintf("needs %s (set by `make test`)", n)
		}
	}
	return vals, ""
}
