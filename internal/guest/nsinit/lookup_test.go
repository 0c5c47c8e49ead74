package nsinit

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	other := filepath.Join(dir, "other")
	os.MkdirAll(bin, 0o755)
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(bin, "tool"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(bin, "data"), []byte("x"), 0o644)
	os.MkdirAll(filepath.Join(bin, "adir"), 0o755)
	path := other + ":" + bin

	if p, f := LookPath("tool", path); f != nil || p != filepath.Join(bin, "tool") {
		t.Fatalf("tool: %q %v", p, f)
	}
	for _, c := range []struct {
		file string
		code int32
		path string
	}{
		{"nosuchcmd", 127, "nosuchcmd"},
		{"data", 126, filepath.Join(bin, "data")},
		{"adir", 126, filepath.Join(bin, "adir")},
		{filepath.Join(bin, "data"), 126, filepath.Join(bin, "data")},
		{filepath.Join(bin, "missing"), 127, filepath.Join(bin, "missing")},
	} {
		_, f := LookPath(c.file, path)
		if f == nil || f.Code != c.code || f.Path != c.path {
			t.Errorf("%s: got %+v, want code %d path %s", c.file, f, c.code, c.path)
		}
	}
	_, f := LookPath("nosuchcmd", path)
	if got := f.Error(); got != `exec "nosuchcmd": executable file not found in $PATH` {
		t.Errorf("message %q", got)
	}
}

func TestPathFromEnv(t *testing.T) {
	if p := PathFromEnv([]string{"A=1"}); p != DefaultPath {
		t.Fatalf("default: %q", p)
	}
	if p := PathFromEnv([]string{"PATH=/a", "PATH=/b"}); p != "/b" {
		t.Fatalf("last wins: %q", p)
	}
}

func TestParseMountOptions(t *testing.T) {
	flags, prop, data := ParseMountOptions([]string{"rbind", "ro", "nosuid", "rslave", "mode=755", "size=65536k"})
	if flags != unix.MS_BIND|unix.MS_REC|unix.MS_RDONLY|unix.MS_NOSUID {
		t.Errorf("flags %#x", flags)
	}
	if prop != unix.MS_SLAVE|unix.MS_REC {
		t.Errorf("propagation %#x", prop)
	}
	if data != "mode=755,size=65536k" {
		t.Errorf("data %q", data)
	}
	flags, _, _ = ParseMountOptions([]string{"ro", "rw"})
	if flags != 0 {
		t.Errorf("rw after ro: %#x", flags)
	}
}
