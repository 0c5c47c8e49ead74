package cpio

import (
	"bytes"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/testenv"
)

func sample(t *testing.T, reverse bool) *Archive {
	t.Helper()
	a := &Archive{}
	add := []func() error{
		func() error { return a.AddFile("/init", []byte("#!agent\n"), true) },
		func() error { return a.AddDir("/dev") },
		func() error { return a.AddCharDev("/dev/console", 0o600, 5, 1) },
		func() error { return a.AddCharDev("/dev/null", 0o666, 1, 3) },
		func() error { return a.AddFile("/lib/modules/6.1/kernel/fs/9p/9p.ko", []byte("ko-9p"), false) },
		func() error {
			return a.AddFile("/lib/modules/6.1/kernel/drivers/virtio/virtio.ko", []byte("ko"), false)
		},
		func() error { return a.AddFile("/etc/hull/modules", []byte("a\nb\n"), false) },
		func() error { return a.AddSymlink("/lib64", "lib") },
		func() error { return a.AddFile("/a-b", []byte("x"), false) },
		func() error { return a.AddDir("/tmp") },
	}
	if reverse {
		slices.Reverse(add)
	}
	for _, f := range add {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

func TestArchiveRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	n, err := sample(t, false).WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) || n%512 != 0 {
		t.Fatalf("WriteTo returned %d, wrote %d bytes (want a multiple of 512)", n, buf.Len())
	}
	recs, err := ReadAll(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	byName := map[string]Record{}
	for i, r := range recs {
		names = append(names, r.Name)
		byName[r.Name] = r
		if r.Ino != uint32(i+1) || r.UID != 0 || r.GID != 0 || r.Mtime != 0 {
			t.Errorf("%s: ino %d uid %d gid %d mtime %d, want %d 0 0 0", r.Name, r.Ino, r.UID, r.GID, r.Mtime, i+1)
		}
	}
	want := []string{
		"a-b", "dev", "dev/console", "dev/null", "etc", "etc/hull", "etc/hull/modules", "init",
		"lib", "lib/modules", "lib/modules/6.1", "lib/modules/6.1/kernel",
		"lib/modules/6.1/kernel/drivers", "lib/modules/6.1/kernel/drivers/virtio",
		"lib/modules/6.1/kernel/drivers/virtio/virtio.ko",
		"lib/modules/6.1/kernel/fs", "lib/modules/6.1/kernel/fs/9p", "lib/modules/6.1/kernel/fs/9p/9p.ko",
		"lib64", "tmp",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("names:\n got %q\nwant %q", names, want)
	}
	// Parents first.
	seen := map[string]bool{}
	for _, n := range names {
		if d := filepath.Dir(n); d != "." && !seen[d] {
			t.Errorf("%s written before its parent %s", n, d)
		}
		seen[n] = true
	}
	checks := []struct {
		name       string
		mode       uint32
		data       string
		rmaj, rmin uint32
	}{
		{"init", TypeReg | 0o755, "#!agent\n", 0, 0},
		{"etc/hull/modules", TypeReg | 0o644, "a\nb\n", 0, 0},
		{"etc", TypeDir | 0o755, "", 0, 0},
		{"dev/console", TypeChar | 0o600, "", 5, 1},
		{"dev/null", TypeChar | 0o666, "", 1, 3},
		{"lib64", TypeSymlink | 0o777, "lib", 0, 0},
	}
	for _, c := range checks {
		r := byName[c.name]
		if r.Mode != c.mode || string(r.Data) != c.data || r.RdevMaj != c.rmaj || r.RdevMin != c.rmin {
			t.Errorf("%s: mode %o data %q rdev %d,%d; want %o %q %d,%d", c.name, r.Mode, r.Data, r.RdevMaj, r.RdevMin, c.mode, c.data, c.rmaj, c.rmin)
		}
	}
}

func TestArchiveDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if _, err := sample(t, false).WriteTo(&a); err != nil {
		t.Fatal(err)
	}
	if _, err := sample(t, true).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(a.Bytes()) != sha256.Sum256(b.Bytes()) {
		t.Fatal("same entries added in a different order gave different archives")
	}
}

func TestArchiveErrors(t *testing.T) {
	a := &Archive{}
	if err := a.AddFile("/x", nil, false); err != nil {
		t.Fatal(err)
	}
	if err := a.AddFile("x", nil, false); err == nil {
		t.Error("duplicate /x accepted")
	}
	if err := a.AddDir("/"); err == nil {
		t.Error("root accepted as an entry")
	}
	if err := a.AddFile("/x/y", nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := a.WriteTo(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "/x") {
		t.Errorf("file with children: err = %v, want one naming /x", err)
	}
}

func TestReadAllRejectsGarbage(t *testing.T) {
	if _, err := ReadAll(strings.NewReader(strings.Repeat("z", 200))); err == nil {
		t.Error("garbage parsed")
	}
	var buf bytes.Buffer
	if _, err := sample(t, false).WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAll(bytes.NewReader(buf.Bytes()[:300])); err == nil {
		t.Error("truncated archive parsed")
	}
}

// TestCpioToolAgrees checks the output against GNU cpio, when installed.
func TestCpioToolAgrees(t *testing.T) {
	testenv.Require(t, testenv.Bins("cpio"))
	cpioBin, _ := exec.LookPath("cpio")
	var buf bytes.Buffer
	if _, err := sample(t, false).WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cpioBin, "-t", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cpio -t: %v", err)
	}
	got := strings.Fields(string(out))
	if len(got) != 20 || got[0] != "a-b" || got[len(got)-1] != "tmp" {
		t.Errorf("cpio -t listed %q", got)
	}
	// Extract for real and compare contents (no device nodes: needs root).
	dir := t.TempDir()
	a := &Archive{}
	_ = a.AddFile("/bin/tool", []byte("hello"), true)
	_ = a.AddFile("/etc/conf", []byte("c"), false)
	buf.Reset()
	if _, err := a.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(cpioBin, "-i", "-d", "--quiet", "--no-absolute-filenames")
	cmd.Dir, cmd.Stdin = dir, &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -i: %v: %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "bin/tool"))
	if err != nil || string(b) != "hello" {
		t.Fatalf("extracted bin/tool = %q, %v", b, err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "bin/tool")); fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/tool mode %v, want 0755", fi.Mode())
	}
}
