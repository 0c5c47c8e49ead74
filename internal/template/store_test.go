package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeTemplate writes a template directory for shape by hand, as a build
// would leave it, and returns its key.
func fakeTemplate(t *testing.T, s *Store, shape Shape) string {
	t.Helper()
	in, err := shape.inputs()
	if err != nil {
		t.Fatal(err)
	}
	key := keyOf(shape, in)
	dir := s.dir(key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	state := []byte("QEVM device state")
	sum := sha256.Sum256(state)
	if err := os.WriteFile(filepath.Join(dir, stateName), state, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(createFile(t, filepath.Join(dir, memoryName)), int64(shape.MemoryMiB)<<20); err != nil {
		t.Fatal(err)
	}
	m := Meta{Version: Version, Key: key, Shape: shape, Inputs: in, Created: time.Now(), StateSHA256: hex.EncodeToString(sum[:])}
	if err := writeMeta(dir, m); err != nil {
		t.Fatal(err)
	}
	return key
}

func createFile(t *testing.T, p string) string {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeShape is a shape over small files of the test's own.
func fakeShape(t *testing.T) Shape {
	dir := t.TempDir()
	w := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Shape{QEMU: w("qemu", "q"), Kernel: w("vmlinux", "k"), Initrd: w("initrd", "i"),
		MachineType: "q35", Accel: "auto", VCPUs: 1, MemoryMiB: 2, ShareTags: []string{"hullshared"}}
}

func TestKeyFollowsEveryInput(t *testing.T) {
	base := fakeShape(t)
	k0, err := base.Key()
	if err != nil {
		t.Fatal(err)
	}
	changed := map[string]func(*Shape){
		"vcpus":        func(s *Shape) { s.VCPUs = 2 },
		"memory":       func(s *Shape) { s.MemoryMiB = 4 },
		"machine":      func(s *Shape) { s.MachineType = "pc" },
		"kernel param": func(s *Shape) { s.KernelParams = []string{"quiet"} },
		"nics":         func(s *Shape) { s.NICs = 1 },
		"share tags":   func(s *Shape) { s.ShareTags = nil },
	}
	for name, change := range changed {
		s := base
		s.KernelParams = slices.Clone(base.KernelParams)
		change(&s)
		k, err := s.Key()
		if err != nil {
			t.Fatal(err)
		}
		if k == k0 {
			t.Errorf("changing the %s kept the key %s", name, k)
		}
	}
	if k, _ := base.Key(); k != k0 {
		t.Fatalf("the same shape twice: keys %s and %s", k0, k)
	}
	// The kernel rewritten with the same bytes and size: a new file.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(base.Kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	if k, _ := base.Key(); k == k0 {
		t.Errorf("rewriting the kernel kept the key %s", k)
	}
	missing := base
	missing.Kernel = "/nonexistent/vmlinux"
	if _, err := missing.Key(); err == nil || !strings.Contains(err.Error(), "/nonexistent/vmlinux") {
		t.Errorf("a missing input: %v, want an error naming it", err)
	}
}

// TestCorruptStateIsRefused: a state file that is not the one recorded
// is not restored; Get would rebuild it (here there is no QEMU to build
// with, so the build's error says which template).
func TestCorruptStateIsRefused(t *testing.T) {
	s := NewStore(t.TempDir(), nil)
	shape := fakeShape(t)
	key := fakeTemplate(t, s, shape)
	c, err := openClone(s.dir(key), key)
	if err != nil {
		t.Fatalf("a whole template: %v", err)
	}
	c.State.Close()
	os.WriteFile(filepath.Join(s.dir(key), stateName), []byte("QEVM tampered"), 0o600)
	if _, err := openClone(s.dir(key), key); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("a tampered state: %v, want an error saying it is corrupt", err)
	}
	os.Truncate(filepath.Join(s.dir(key), memoryName), 1<<20)
	if _, err := openClone(s.dir(key), key); err == nil || !strings.Contains(err.Error(), "memory file holds 1048576 bytes") {
		t.Errorf("a short memory file: %v, want an error naming its size", err)
	}
}

// TestGCRemovesStaleAndAbandoned: gc removes a template whose kernel
// changed and a build whose builder died, and keeps a current template.
func TestGCRemovesStaleAndAbandoned(t *testing.T) {
	s := NewStore(t.TempDir(), nil)
	current := fakeShape(t)
	keep := fakeTemplate(t, s, current)
	old := fakeShape(t)
	stale := fakeTemplate(t, s, old)
	os.WriteFile(old.Kernel, []byte("a new kernel"), 0o600)
	abandoned := strings.Repeat("ab", 16)
	os.MkdirAll(s.buildDir(abandoned), 0o700)

	would, err := s.GC(true)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(would)
	want := []string{stale, abandoned + ".build"}
	slices.Sort(want)
	if !slices.Equal(would, want) {
		t.Fatalf("gc --dry-run would remove %v, want %v", would, want)
	}
	if _, err := os.Stat(s.dir(stale)); err != nil {
		t.Fatalf("dry run removed something: %v", err)
	}
	if got, err := s.GC(false); err != nil || len(got) != 2 {
		t.Fatalf("gc removed %v (%v)", got, err)
	}
	list, _ := s.List()
	if len(list) != 1 || list[0].Key != keep || list[0].Stale {
		t.Errorf("after gc: %+v, want only %s, not stale", list, keep)
	}
}

func TestRemoveByPrefix(t *testing.T) {
	s := NewStore(t.TempDir(), nil)
	key := fakeTemplate(t, s, fakeShape(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.Remove(ctx, "zz"); err == nil || !strings.Contains(err.Error(), `"zz"`) {
		t.Errorf("removing an unknown key: %v, want an error naming it", err)
	}
	full, err := s.Remove(ctx, key[:6])
	if err != nil || full != key {
		t.Fatalf("Remove(%s) = %s, %v", key[:6], full, err)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Errorf("still listed: %+v", list)
	}
}

// TestEvictKeepsTheRecentlyUsed: past MaxTemplates, the least recently
// used templates go, never the one just built.
func TestEvictKeepsTheRecentlyUsed(t *testing.T) {
	s := NewStore(t.TempDir(), nil)
	base := fakeShape(t)
	var keys []string
	for i := range MaxTemplates + 3 {
		sh := base
		sh.VCPUs = i + 1
		k := fakeTemplate(t, s, sh)
		// Used i minutes after the first; the first is the oldest.
		at := time.Now().Add(time.Duration(i-60) * time.Minute)
		os.Chtimes(s.dir(k), at, at)
		keys = append(keys, k)
	}
	oldest := keys[0]
	// The oldest was just built: it stays; the next three oldest go.
	s.evict(oldest)
	list, _ := s.List()
	var left []string
	for _, in := range list {
		left = append(left, in.Key)
	}
	if len(left) != MaxTemplates {
		t.Fatalf("%d templates left, want %d: %v", len(left), MaxTemplates, left)
	}
	for _, k := range append([]string{oldest}, keys[4:]...) {
		if !slices.Contains(left, k) {
			t.Errorf("template %s was evicted; want the three least recently used after the kept one", k)
		}
	}
}
