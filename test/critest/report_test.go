package critest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

func TestVerdict(t *testing.T) {
	file := filepath.Join(t.TempDir(), "exc.txt")
	os.WriteFile(file, []byte("# comment\n\nall | A | pending: x\n2.4 | B | VM limit\n1.6,1.7 | C | old\nall | D | fixed meanwhile\n"), 0o644)
	exc, err := readExceptions(file)
	if err != nil {
		t.Fatal(err)
	}
	runc := map[string]string{"A": "passed", "B": "passed", "C": "passed", "D": "passed", "E": "passed", "F": "failed", "G": "passed"}
	hull := map[string]string{"A": "failed", "B": "failed", "C": "failed", "D": "passed", "E": "skipped", "F": "failed", "G": "passed"}
	unexcused, excused, stale := verdict(runc, hull, exc, "2.4")
	// C is excepted on 1.x only; E skipped for hull counts as not passing.
	if want := []string{"C (hull: failed)", "E (hull: skipped)"}; !slices.Equal(unexcused, want) {
		t.Errorf("unexcused %q, want %q", unexcused, want)
	}
	if len(excused) != 2 || excused[0].Spec != "A" || excused[1].Spec != "B" {
		t.Errorf("excused %+v", excused)
	}
	if len(stale) != 1 || stale[0].Spec != "D" {
		t.Errorf("stale %+v", stale)
	}
	if ran, passed := counts(hull); ran != 6 || passed != 2 {
		t.Errorf("counts(hull) = %d ran, %d passed; want 6, 2", ran, passed)
	}
}

func TestReadExceptionsRejectsBadLines(t *testing.T) {
	file := filepath.Join(t.TempDir(), "exc.txt")
	os.WriteFile(file, []byte("all | spec without reason\n"), 0o644)
	if _, err := readExceptions(file); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("got %v, want an error naming line 1", err)
	}
}

// The repository's exceptions file parses, and every entry names a
// version this package runs.
func TestExceptionsFile(t *testing.T) {
	exc, err := readExceptions("exceptions.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exc {
		for _, v := range e.Versions {
			if v != "all" && !slices.Contains(harness.Versions, v) {
				t.Errorf("exceptions.txt:%d: unknown containerd version %q", e.Line, v)
			}
		}
	}
}
