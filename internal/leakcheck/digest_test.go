package leakcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTreeDigest(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "a")
	os.WriteFile(f, []byte("x"), 0o644)
	d0 := TreeDigest(dir)
	if TreeDigest(dir) != d0 || strings.HasPrefix(d0, "error") {
		t.Fatalf("digest not stable: %s", d0)
	}
	os.WriteFile(f, []byte("y"), 0o644)
	d1 := TreeDigest(dir)
	os.Chmod(f, 0o600)
	d2 := TreeDigest(dir)
	os.Symlink("/etc", filepath.Join(dir, "l"))
	d3 := TreeDigest(dir)
	if d1 == d0 || d2 == d1 || d3 == d2 {
		t.Errorf("a change went unseen: %s %s %s %s", d0, d1, d2, d3)
	}
	if got := TreeDigest(filepath.Join(dir, "missing")); !strings.HasPrefix(got, "error") {
		t.Errorf("missing root: %s", got)
	}
}
