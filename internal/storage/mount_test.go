package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
	"github.com/hull-runtime/hull/internal/state"

	"github.com/hull-runtime/hull/internal/testenv"
)

// checkingRecorder records into a real state handle, and checks at each
// Record that the resource is not acquired yet.
type checkingRecorder struct {
	t   *testing.T
	h   *state.Handle
	err error // returned instead of recording, when set
}

func (c *checkingRecorder) Record(r state.Resource) error {
	c.t.Helper()
	if c.err != nil {
		return c.err
	}
	switch r.Kind {
	case state.KindMount:
		if r.Data[state.DataMountID] != "" {
			break // the record of a mount made, with its identity
		}
		if mounted, _ := mountinfo.Mounted(r.Path); mounted {
			c.t.Errorf("%s recorded after it was mounted", r)
		}
	case state.KindDir:
		if _, err := os.Lstat(r.Path); err == nil {
			c.t.Errorf("%s recorded after it was created", r)
		}
	}
	return c.h.Record(r)
}

func newStore(t *testing.T) (*state.Store, *state.Handle) {
	t.Helper()
	st := &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	h, err := st.Create("sb1", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return st, h
}

func TestMakeContainerDirRecordsFirst(t *testing.T) {
	_, h := newStore(t)
	shared := filepath.Join(h.Dir(), "shared")
	if err := os.Mkdir(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := &checkingRecorder{t: t, h: h}
	if err := MakeContainerDir(rec, shared, "c1"); err != nil {
		t.Fatal(err)
	}
	got := h.State().Resources
	if len(got) != 1 || got[0].Kind != state.KindDir || got[0].Path != ContainerDir(shared, "c1") || got[0].Container != "c1" {
		t.Fatalf("recorded %+v", got)
	}
	// A failed Record acquires nothing.
	rec.err = errors.New("disk full")
	if err := MakeContainerDir(rec, shared, "c2"); err == nil {
		t.Fatal("MakeContainerDir succeeded without its record")
	}
	if _, err := os.Lstat(ContainerDir(shared, "c2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("c2's directory was created without a record: %v", err)
	}
	if err := BindInto(rec, "c2", shared, shared, filepath.Join(ContainerDir(shared, "c2"), "x"), hostfs.BindOptions{}); err == nil {
		t.Fatal("BindInto succeeded without its record")
	}
	if _, err := os.Lstat(ContainerDir(shared, "c2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("BindInto created its mount point without a record: %v", err)
	}
}

func needRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.Root("real mounts"))
}

// unmountAllUnder is a test's safety net: nothing it mounted survives it.
func unmountAllUnder(dir string) {
	ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	for i := len(ms) - 1; i >= 0; i-- {
		unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
	}
}

// The release path with real mounts: a container's rootfs mount, its
// rootfs and volume binds, released by container, then the sandbox; the
// bound sources are untouched and a second release is a no-op.
func TestReleaseRealMounts(t *testing.T) {
	needRoot(t)
	st, h := newStore(t)
	top := filepath.Dir(st.Root)
	t.Cleanup(func() { unmountAllUnder(top) })
	tree := filepath.Join(h.Dir(), TreeName)
	shared := filepath.Join(h.Dir(), ShareName)
	// Host side: a bundle and a volume with a file in it.
	bundle := filepath.Join(top, "bundle")
	volume := filepath.Join(top, "volume")
	hostsFile := filepath.Join(top, "hosts")
	for _, d := range []string{bundle, volume} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(volume, "data"), []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostsFile, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	rec := &checkingRecorder{t: t, h: h}
	rootfs := filepath.Join(bundle, "rootfs")
	cdir := ContainerDir(tree, "c1")
	steps := []func() error{
		func() error { return MakeShare(rec, h.Dir()) },
		func() error {
			return MountRootfs(rec, "c1", []*types.Mount{{Type: "tmpfs", Source: "tmpfs", Options: []string{"size=1m"}}}, rootfs)
		},
		func() error { return MakeContainerDir(rec, tree, "c1") },
		func() error {
			return BindInto(rec, "c1", tree, rootfs, filepath.Join(cdir, "rootfs"), hostfs.BindOptions{})
		},
		func() error {
			return BindInto(rec, "c1", tree, volume, filepath.Join(cdir, "mounts", "m0-data"), hostfs.BindOptions{ReadOnly: true})
		},
		func() error {
			return BindInto(rec, "c1", tree, hostsFile, filepath.Join(cdir, "mounts", "m1-hosts"), hostfs.BindOptions{ReadOnly: true})
		},
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if n := len(h.State().Resources); n != 9 {
		t.Fatalf("%d resources recorded, want 9: %+v", n, h.State().Resources)
	}
	view := ContainerDir(shared, "c1")
	if b, err := os.ReadFile(filepath.Join(view, "mounts", "m0-data", "data")); err != nil || string(b) != "keep me" {
		t.Fatalf("volume not visible through the share: %q %v", b, err)
	}
	// The view's structure is read-only; its rootfs leaf is writable,
	// its read-only volume is not.
	for _, p := range []string{filepath.Join(shared, "planted"), filepath.Join(view, "planted"), filepath.Join(view, "mounts", "m0-data", "planted")} {
		if err := os.Mkdir(p, 0o755); !errors.Is(err, unix.EROFS) {
			t.Errorf("mkdir %s in the share: %v, want EROFS", p, err)
		}
	}
	if err := os.Rename(view, filepath.Join(shared, "moved")); !errors.Is(err, unix.EROFS) && !errors.Is(err, unix.EBUSY) {
		t.Errorf("renaming %s: %v, want EROFS", view, err)
	}
	if err := os.WriteFile(filepath.Join(view, "rootfs", "written"), []byte("x"), 0o644); err != nil {
		t.Errorf("writing the rootfs through the share: %v", err)
	}

	ctx := context.Background()
	for range 2 { // idempotent
		if err := state.Release(ctx, h, "c1", state.BuiltinReleasers()); err != nil {
			t.Fatalf("releasing c1: %v", err)
		}
	}
	for _, d := range []string{cdir, view, rootfs} {
		if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(d)); len(ms) > 0 {
			t.Errorf("still mounted after releasing c1: %s", ms[0].Mountpoint)
		}
	}
	if _, err := os.Lstat(cdir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left: %v", cdir, err)
	}
	if b, err := os.ReadFile(filepath.Join(volume, "data")); err != nil || string(b) != "keep me" {
		t.Errorf("the volume's data was touched: %q %v", b, err)
	}
	if _, err := os.Stat(hostsFile); err != nil {
		t.Errorf("the bound file was removed: %v", err)
	}
	if left := h.State().Resources; len(left) != 4 {
		t.Errorf("left recorded after releasing c1: %+v", left)
	}
	if err := state.Release(ctx, h, "", state.BuiltinReleasers()); err != nil {
		t.Fatalf("releasing the sandbox: %v", err)
	}
	if _, err := os.Lstat(st.Dir("sb1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox directory left: %v", err)
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(top)); len(ms) > 0 {
		t.Errorf("still mounted after releasing the sandbox: %s", ms[0].Mountpoint)
	}
	if err := st.Release(ctx, "sb1", state.BuiltinReleasers()); err != nil {
		t.Errorf("second release: %v", err)
	}
}

// A create that fails halfway (here: a bind whose source vanished) is
// rolled back by the same release, leaving nothing mounted or recorded.
func TestRollbackRealMounts(t *testing.T) {
	needRoot(t)
	st, h := newStore(t)
	top := filepath.Dir(st.Root)
	t.Cleanup(func() { unmountAllUnder(top) })
	tree := filepath.Join(h.Dir(), "tree")
	os.Mkdir(tree, 0o700)
	rec := &checkingRecorder{t: t, h: h}
	rootfs := filepath.Join(top, "bundle", "rootfs")
	if err := MountRootfs(rec, "c1", []*types.Mount{{Type: "tmpfs", Source: "tmpfs"}}, rootfs); err != nil {
		t.Fatal(err)
	}
	if err := MakeContainerDir(rec, tree, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := BindInto(rec, "c1", tree, rootfs, filepath.Join(ContainerDir(tree, "c1"), "rootfs"), hostfs.BindOptions{}); err != nil {
		t.Fatal(err)
	}
	err := BindInto(rec, "c1", tree, filepath.Join(top, "gone"), filepath.Join(ContainerDir(tree, "c1"), "mounts", "m0"), hostfs.BindOptions{})
	if err == nil || !strings.Contains(err.Error(), "bind mount source") {
		t.Fatalf("bind of a missing source: %v", err)
	}
	if err := state.Release(context.Background(), h, "c1", state.BuiltinReleasers()); err != nil {
		t.Fatal(err)
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(top)); len(ms) > 0 {
		t.Errorf("still mounted after the rollback: %s", ms[0].Mountpoint)
	}
	if left := h.State().Resources; len(left) != 0 {
		t.Errorf("still recorded after the rollback: %+v", left)
	}
}
