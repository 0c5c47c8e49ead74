package hostfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestMkdirAllRefusesWhatIsInTheWay(t *testing.T) {
	top := t.TempDir()
	anchor := filepath.Join(top, "anchor")
	outside := filepath.Join(top, "outside")
	must(t, os.MkdirAll(anchor, 0o755))
	must(t, os.MkdirAll(outside, 0o755))
	must(t, os.Symlink(outside, filepath.Join(anchor, "link")))
	must(t, os.WriteFile(filepath.Join(anchor, "file"), nil, 0o644))
	for rel, want := range map[string]string{
		"link/x":   "symlink",
		"link":     "symlink",
		"file/x":   "not a directory",
		"../x":     "invalid component",
		"a/../../": "invalid component",
	} {
		fd, err := MkdirAll(anchor, rel, 0o755)
		if err == nil {
			unix.Close(fd)
			t.Errorf("MkdirAll %s succeeded", rel)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("MkdirAll %s: %v, want %q", rel, err, want)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("something was created through the symlink: %v", ents)
	}
	fd, err := MkdirAll(anchor, "a/b/c", 0o755)
	must(t, err)
	unix.Close(fd)
	if st, err := os.Lstat(filepath.Join(anchor, "a", "b", "c")); err != nil || !st.IsDir() {
		t.Errorf("a/b/c: %v", err)
	}
}

func TestRemoveAllFollowsNothing(t *testing.T) {
	top := t.TempDir()
	anchor := filepath.Join(top, "anchor")
	outside := filepath.Join(top, "outside")
	must(t, os.MkdirAll(filepath.Join(anchor, "d", "e"), 0o755))
	must(t, os.MkdirAll(filepath.Join(outside, "keep"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "keep", "f"), []byte("keep"), 0o644))
	must(t, os.Symlink(outside, filepath.Join(anchor, "d", "to-outside")))
	must(t, os.Symlink(filepath.Join(outside, "keep", "f"), filepath.Join(anchor, "d", "e", "to-file")))
	must(t, os.Symlink("/", filepath.Join(anchor, "d", "e", "root")))
	must(t, unix.Mkfifo(filepath.Join(anchor, "d", "fifo"), 0o600))
	// A symlink in the path to what is removed is not followed either.
	must(t, os.Symlink(outside, filepath.Join(anchor, "via")))
	if err := RemoveAll(anchor, "via/keep"); err == nil {
		t.Error("RemoveAll through a symlink succeeded")
	}
	must(t, RemoveAll(anchor, "d"))
	must(t, RemoveAll(anchor, "via")) // the symlink itself
	must(t, RemoveAll(anchor, "missing/x"))
	if ents, _ := os.ReadDir(anchor); len(ents) != 0 {
		t.Errorf("left in the anchor: %v", ents)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "keep", "f")); err != nil || string(b) != "keep" {
		t.Errorf("outside file: %q %v", b, err)
	}
	// A file where a directory was recorded is removed.
	must(t, os.WriteFile(filepath.Join(anchor, "was-dir"), nil, 0o644))
	must(t, RemoveAll(anchor, "was-dir"))
	if _, err := os.Lstat(filepath.Join(anchor, "was-dir")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("was-dir left: %v", err)
	}
}

func TestRemoveAllDeepTree(t *testing.T) {
	anchor := t.TempDir()
	p := anchor
	for range 3*maxDepth + 5 {
		p = filepath.Join(p, "d")
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Skipf("cannot build a deep tree here: %v", err)
		}
	}
	must(t, os.WriteFile(filepath.Join(p, "leaf"), nil, 0o644))
	if err := RemoveAll(anchor, "d"); err != nil {
		t.Errorf("RemoveAll of a deep tree: %v", err)
	}
	if ents, _ := os.ReadDir(anchor); len(ents) != 0 {
		t.Errorf("left: %v", ents)
	}
}

func TestRel(t *testing.T) {
	for _, c := range []struct {
		path string
		ok   bool
	}{{"/a/b/c", true}, {"/a/b", false}, {"/a/bc", false}, {"/a", false}, {"/x/y", false}} {
		_, err := Rel("/a/b", c.path)
		if (err == nil) != c.ok {
			t.Errorf("Rel(/a/b, %s) = %v, want ok=%v", c.path, err, c.ok)
		}
	}
}

func TestOpenSourceRefusals(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	must(t, os.Symlink(dir, link))
	for _, src := range []string{link, "/proc", "/proc/self/status", "/sys", "/dev/null"} {
		fd, err := OpenSource(src)
		if err == nil {
			unix.Close(fd)
			t.Errorf("OpenSource %s succeeded", src)
		} else if !strings.Contains(err.Error(), src) {
			t.Errorf("OpenSource %s: %v, want an error naming it", src, err)
		}
	}
	fd, err := OpenSource(dir)
	must(t, err)
	unix.Close(fd)
}

func TestIdentitySame(t *testing.T) {
	a := Identity{ID: 7, OldID: 30, Dev: 1, Ino: 2}
	for _, c := range []struct {
		got  Identity
		same bool
	}{
		{Identity{ID: 7, OldID: 99, Dev: 5, Ino: 6}, true}, // unique ids decide
		{Identity{ID: 8, OldID: 30, Dev: 1, Ino: 2}, false},
		{Identity{OldID: 30, Dev: 1, Ino: 2}, true}, // no unique id (Linux < 6.8)
		{Identity{OldID: 30, Dev: 1, Ino: 3}, false},
	} {
		if got := a.Same(c.got); got != c.same {
			t.Errorf("%+v.Same(%+v) = %v", a, c.got, got)
		}
	}
}
