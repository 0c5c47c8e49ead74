package nsinit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// sameFile fails unless fd is the file at path.
func sameFile(t *testing.T, fd int, path string) {
	t.Helper()
	var a, b unix.Stat_t
	if err := unix.Fstat(fd, &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(path, &b); err != nil {
		t.Fatalf("mount point not at %s: %v", path, err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		t.Fatalf("descriptor is not %s", path)
	}
}

// openTarget resolves and creates mount points inside the rootfs whichever
// way it takes (the parent opened once, or the walk): a symlink in the
// container's rootfs pointing at a host path, "..", or an absolute link
// as the last element never reach outside it.
func TestOpenTargetStaysInRoot(t *testing.T) {
	host := t.TempDir() // stands for the host: must stay empty
	cases := []struct {
		name  string
		setup func(root string)
		dest  string
		dir   bool
		want  string // where the mount point must be, in the rootfs
		mode  uint32
	}{
		{"existing file", func(r string) { os.WriteFile(filepath.Join(r, "etc/hosts"), nil, 0o600) },
			"/etc/hosts", false, "etc/hosts", unix.S_IFREG},
		{"missing file", nil, "/etc/hostname", false, "etc/hostname", unix.S_IFREG},
		{"missing file, missing directories", nil, "/a/b/c", false, "a/b/c", unix.S_IFREG},
		{"missing directory", nil, "/etc/sub", true, "etc/sub", unix.S_IFDIR},
		{"existing directory", nil, "/etc", true, "etc", unix.S_IFDIR},
		{"the root", nil, "/", true, ".", unix.S_IFDIR},
		{"dotdot", nil, "/../../etc/resolv.conf", false, "etc/resolv.conf", unix.S_IFREG},
		{"last element an absolute link to the host", func(r string) {
			os.Symlink(filepath.Join(host, "hosts"), filepath.Join(r, "etc/hosts"))
		}, "/etc/hosts", false, filepath.Join(host, "hosts"), unix.S_IFREG},
		{"last element a relative link out", func(r string) {
			os.Symlink("../../../../../.."+host+"/x", filepath.Join(r, "etc/x"))
		}, "/etc/x", true, filepath.Join(host, "x"), unix.S_IFDIR},
		{"parent an absolute link to the host", func(r string) {
			os.Symlink(host, filepath.Join(r, "link"))
		}, "/link/f", false, filepath.Join(host, "f"), unix.S_IFREG},
		{"parent a link to a directory in the rootfs", func(r string) {
			os.Symlink("/etc", filepath.Join(r, "cfg"))
		}, "/cfg/f", false, "etc/f", unix.S_IFREG},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			os.Mkdir(filepath.Join(root, "etc"), 0o755)
			if c.setup != nil {
				c.setup(root)
			}
			rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(rootFD)
			fd, err := openTarget(rootFD, c.dest, c.dir)
			if err != nil {
				t.Fatalf("openTarget(%s): %v", c.dest, err)
			}
			defer unix.Close(fd)
			sameFile(t, fd, filepath.Join(root, c.want))
			var st unix.Stat_t
			unix.Fstat(fd, &st)
			if st.Mode&unix.S_IFMT != c.mode {
				t.Fatalf("%s: mode %o, want type %o", c.dest, st.Mode, c.mode)
			}
			if ents, _ := os.ReadDir(host); len(ents) != 0 {
				t.Fatalf("created outside the rootfs: %s/%s", host, ents[0].Name())
			}
		})
	}
}

// A file bind's target that exists as a directory is opened as it is,
// not replaced: mount(2) then refuses the bind, as under runc.
func TestOpenTargetExistingOtherType(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc/hosts"), 0o755)
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rootFD)
	fd, err := openTarget(rootFD, "/etc/hosts", false)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sameFile(t, fd, filepath.Join(root, "etc/hosts"))
}

// A bind's source is opened once and bound from its descriptor; a
// missing one is named.
func TestOpenSource(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	os.Symlink("f", filepath.Join(dir, "l"))
	for _, c := range []struct {
		path  string
		isDir bool
	}{{dir, true}, {filepath.Join(dir, "f"), false}, {filepath.Join(dir, "l"), false}} {
		fd, isDir, err := openSource(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if isDir != c.isDir {
			t.Errorf("%s: directory %v, want %v", c.path, isDir, c.isDir)
		}
		unix.Close(fd)
	}
	missing := filepath.Join(dir, "missing")
	if _, _, err := openSource(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing source: %v, want an error naming %s", err, missing)
	}
}
