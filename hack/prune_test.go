// Package hack_test tests the scripts of hack/ that can run without a
// build: here prune-cache.sh, which keeps the kernel and QEMU caches from
// growing with every change of their inputs.
package hack_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// cacheEntry is a key directory of a fake cache, last used age ago,
// built from the kernel source version (none: no source file).
type cacheEntry struct {
	key     string
	age     time.Duration
	version string
}

func makeCache(t *testing.T, entries []cacheEntry, extra ...string) string {
	t.Helper()
	cache := t.TempDir()
	now := time.Now()
	for _, e := range entries {
		dir := filepath.Join(cache, e.key)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if e.version != "" {
			src := "linux-source-6.1=" + e.version + "\npatch 0001-x.patch\n"
			if err := os.WriteFile(filepath.Join(dir, "source"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(dir, now.Add(-e.age), now.Add(-e.age)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range extra {
		if err := os.MkdirAll(filepath.Join(cache, name, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return cache
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

func prune(t *testing.T, dir string) (string, error) {
	t.Helper()
	out, err := exec.Command("bash", "prune-cache.sh", dir).CombinedOutput()
	return string(out), err
}

func TestPruneKeepsTheEntryUsedAndTheTwoUsedLast(t *testing.T) {
	const (
		a = "aaaaaaaaaaaaaaaa"
		b = "bbbbbbbbbbbbbbbb"
		c = "cccccccccccccccc"
		d = "dddddddddddddddd"
		e = "eeeeeeeeeeeeeeee"
	)
	// d, the oldest, is the one in use: it stays, as do a and b, the two
	// others used last; c and e go. src-6.1.1 stays (a was built from
	// it), src-6.1.2 goes (only c and e were); build/ and what is not a key
	// stay.
	cache := makeCache(t, []cacheEntry{
		{a, 1 * time.Hour, "6.1.1"},
		{b, 2 * time.Hour, ""},
		{c, 3 * time.Hour, "6.1.2"},
		{e, 4 * time.Hour, "6.1.2"},
		{d, 5 * time.Hour, "6.1.3"},
	}, "src-6.1.1", "src-6.1.2", "src-6.1.3", "build", "work", "cafe")
	before := time.Now()
	out, err := prune(t, filepath.Join(cache, d))
	if err != nil {
		t.Fatalf("prune-cache.sh: %v\n%s", err, out)
	}
	got := names(t, cache)
	want := []string{".lock", a, b, "build", "cafe", d, "src-6.1.1", "src-6.1.3", "work"}
	if !slices.Equal(got, want) {
		t.Fatalf("cache after pruning holds %q, want %q\noutput:\n%s", got, want, out)
	}
	for _, gone := range []string{c, e, "src-6.1.2"} {
		if !strings.Contains(out, filepath.Join(cache, gone)) {
			t.Errorf("output does not name %s, which it removed:\n%s", gone, out)
		}
	}
	// d is marked as used: the next pruning counts it among the last used.
	fi, err := os.Stat(filepath.Join(cache, d))
	if err != nil {
		t.Fatal(err)
	}
	if fi.ModTime().Before(before.Add(-time.Second)) {
		t.Errorf("%s was not marked as used (mtime %v, before the run %v)", d, fi.ModTime(), before)
	}
}

func TestPruneRefusesWhatIsNoEntry(t *testing.T) {
	cache := makeCache(t, []cacheEntry{
		{"aaaaaaaaaaaaaaaa", time.Hour, ""},
		{"bbbbbbbbbbbbbbbb", 2 * time.Hour, ""},
		{"cccccccccccccccc", 3 * time.Hour, ""},
		{"dddddddddddddddd", 4 * time.Hour, ""},
	}, "build")
	before := names(t, cache)
	for _, dir := range []string{
		filepath.Join(cache, "build"),            // not named by a key
		filepath.Join(cache, "eeeeeeeeeeeeeeee"), // a key, but missing
	} {
		out, err := prune(t, dir)
		if err == nil {
			t.Errorf("prune-cache.sh %s succeeded, want an error", dir)
		}
		if !strings.Contains(out, dir) {
			t.Errorf("prune-cache.sh %s: the error does not name the directory:\n%s", dir, out)
		}
		if got := names(t, cache); !slices.Equal(got, before) {
			t.Errorf("prune-cache.sh %s changed the cache: %q, was %q", dir, got, before)
		}
	}
}
