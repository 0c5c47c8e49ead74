package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("root test (real mounts): run `go test ./internal/state` as root")
	}
}

// mounted says whether dir is a mount's root.
func mounted(t *testing.T, dir string) bool {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	_, root, err := hostfs.MountIdentity(fd)
	return err == nil && root
}

func tmpfsAt(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// mount -t tmpfs tmpfs DIR
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
}

// CVE-2020-2024's shape: the directory holding a recorded mount is
// renamed and a symlink to a host directory with a mount of its own at
// the same relative path takes its place. The recorded mount is found by
// its identity and unmounted; the host's is not touched, nor its files.
func TestReleaseMountByIdentityAfterRename(t *testing.T) {
	needRoot(t)
	top := t.TempDir()
	tree := filepath.Join(top, "tree")
	host := filepath.Join(top, "host")
	tmpfsAt(t, filepath.Join(tree, "c1", "m"))
	tmpfsAt(t, filepath.Join(host, "m"))
	if err := os.WriteFile(filepath.Join(host, "m", "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := hostfs.Open(tree, "c1/m", unix.O_PATH, false)
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := hostfs.MountIdentity(fd)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	r := WithMountIdentity(Anchored(Resource{Kind: KindMount, Key: filepath.Join(tree, "c1", "m")}, tree), id)
	d := Anchored(Resource{Kind: KindDir, Key: filepath.Join(tree, "c1")}, tree)

	if err := os.Rename(filepath.Join(tree, "c1"), filepath.Join(tree, "moved")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(tree, "c1")); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := ReleaseMount(context.Background(), r); err != nil {
			t.Fatalf("releasing the moved mount: %v", err)
		}
	}
	if mounted(t, filepath.Join(tree, "moved", "m")) {
		t.Error("the recorded mount, moved, is still mounted")
	}
	if !mounted(t, filepath.Join(host, "m")) {
		t.Error("the host's mount behind the planted symlink was unmounted")
	}
	if err := ReleaseDir(context.Background(), d); err != nil {
		t.Fatalf("releasing the dir: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(tree, "c1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the planted symlink is left: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(host, "m", "keep")); err != nil || string(b) != "keep" {
		t.Errorf("the host's file behind the symlink: %q %v", b, err)
	}
}

// Records written before anchors and identities existed are released by
// path, with no symlink followed.
func TestReleaseOldRecordsFollowNoSymlink(t *testing.T) {
	needRoot(t)
	top := t.TempDir()
	shared := filepath.Join(top, "shared")
	host := filepath.Join(top, "host")
	tmpfsAt(t, filepath.Join(host, "rootfs"))
	tmpfsAt(t, filepath.Join(shared, "c2", "rootfs"))
	if err := os.Symlink(host, filepath.Join(shared, "c1")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ReleaseMount(ctx, Resource{Kind: KindMount, Key: filepath.Join(shared, "c1", "rootfs")}); err != nil {
		t.Fatal(err)
	}
	if !mounted(t, filepath.Join(host, "rootfs")) {
		t.Error("an old record unmounted through a symlink")
	}
	if err := ReleaseMount(ctx, Resource{Kind: KindMount, Key: filepath.Join(shared, "c2", "rootfs")}); err != nil {
		t.Fatal(err)
	}
	if mounted(t, filepath.Join(shared, "c2", "rootfs")) {
		t.Error("an old record's mount at its real path is still mounted")
	}
	for _, c := range []string{"c1", "c2"} {
		if err := ReleaseDir(ctx, Resource{Kind: KindDir, Key: filepath.Join(shared, c)}); err != nil {
			t.Fatalf("releasing old dir record %s: %v", c, err)
		}
		if _, err := os.Lstat(filepath.Join(shared, c)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left: %v", c, err)
		}
	}
	if _, err := os.Stat(filepath.Join(host, "rootfs")); err != nil {
		t.Errorf("the host directory behind the symlink: %v", err)
	}
}

// A dir with a mount under it is not removed through the mount, whatever
// the mount is (a directory or a file bind), and the error says so.
func TestReleaseDirStopsAtMounts(t *testing.T) {
	needRoot(t)
	top := t.TempDir()
	tmpfsAt(t, filepath.Join(top, "d", "sub", "m"))
	if err := os.WriteFile(filepath.Join(top, "d", "sub", "m", "keep"), []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := ReleaseDir(context.Background(), Anchored(Resource{Kind: KindDir, Key: filepath.Join(top, "d")}, top))
	if !errors.Is(err, hostfs.ErrMounted) {
		t.Fatalf("removing a dir with a mount under it: %v, want ErrMounted", err)
	}
	if b, err := os.ReadFile(filepath.Join(top, "d", "sub", "m", "keep")); err != nil || string(b) != "keep" {
		t.Errorf("the mount's file: %q %v", b, err)
	}
	file := filepath.Join(top, "e", "f")
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(file, nil, 0o644)
	// mount --bind /etc/hostname FILE
	if err := unix.Mount("/etc/hostname", file, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(file, unix.MNT_DETACH) })
	err = ReleaseDir(context.Background(), Anchored(Resource{Kind: KindDir, Key: filepath.Dir(file)}, top))
	if !errors.Is(err, hostfs.ErrMounted) {
		t.Fatalf("removing a dir with a file bind under it: %v, want ErrMounted", err)
	}
}
