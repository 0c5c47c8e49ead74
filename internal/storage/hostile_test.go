package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/api/types"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/state"
)

// canary is a host directory outside the sandbox that a planted symlink
// points at; after every release it must be byte-identical.
type canary struct {
	dir  string
	file string
	sum  string
}

func newCanary(t *testing.T, top string) *canary {
	t.Helper()
	c := &canary{dir: filepath.Join(top, "canary"), file: filepath.Join(top, "canary-file")}
	for _, d := range []string{c.dir, filepath.Join(c.dir, "rootfs"), filepath.Join(c.dir, "mounts", "m0-data")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(c.dir, "precious"), filepath.Join(c.dir, "mounts", "m0-data", "x"), c.file} {
		if err := os.WriteFile(f, []byte("precious "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.sum = leakcheck.TreeDigest(c.dir, c.file)
	return c
}

func (c *canary) check(t *testing.T) {
	t.Helper()
	if got := leakcheck.TreeDigest(c.dir, c.file); got != c.sum {
		t.Errorf("the canary outside the sandbox changed (%s)", got)
	}
}

// podFixture is a sandbox with its share and one container c1 with a
// rootfs and a volume bound in the tree, as the shim builds them.
type podFixture struct {
	st     *state.Store
	h      *state.Handle
	top    string
	tree   string
	shared string
	volume string
	canary *canary
}

func newPod(t *testing.T) *podFixture {
	t.Helper()
	st, h := newStore(t)
	top := filepath.Dir(st.Root)
	t.Cleanup(func() { unmountAllUnder(top) })
	p := &podFixture{st: st, h: h, top: top, tree: filepath.Join(h.Dir(), TreeName), shared: filepath.Join(h.Dir(), ShareName),
		volume: filepath.Join(top, "volume"), canary: newCanary(t, top)}
	if err := os.MkdirAll(p.volume, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := MakeShare(h, h.Dir()); err != nil {
		t.Fatal(err)
	}
	p.addContainer(t, "c1")
	return p
}

func (p *podFixture) addContainer(t *testing.T, id string) {
	t.Helper()
	rootfs := filepath.Join(p.top, "bundle-"+id, "rootfs")
	if err := MountRootfs(p.h, id, []*types.Mount{{Type: "tmpfs", Source: "tmpfs", Options: []string{"size=1m"}}}, rootfs); err != nil {
		t.Fatal(err)
	}
	cdir := ContainerDir(p.tree, id)
	if err := MakeContainerDir(p.h, p.tree, id); err != nil {
		t.Fatal(err)
	}
	if err := BindInto(p.h, id, p.tree, rootfs, filepath.Join(cdir, "rootfs"), hostfs.BindOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := BindInto(p.h, id, p.tree, p.volume, filepath.Join(cdir, "mounts", "m0-data"), hostfs.BindOptions{}); err != nil {
		t.Fatal(err)
	}
}

// releaseAndCheck releases the whole sandbox, which must succeed, and
// checks that nothing is mounted under the test's directory, the sandbox
// directory is gone and the canary is intact.
func (p *podFixture) releaseAndCheck(t *testing.T) {
	t.Helper()
	// The container first: its mounts are found by identity wherever
	// they were moved, not detached with the tree.
	if err := state.Release(context.Background(), p.h, "c1", state.BuiltinReleasers()); err != nil {
		t.Errorf("releasing c1: %v", err)
	}
	ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(p.top))
	for _, m := range ms {
		if m.Mountpoint != p.tree && m.Mountpoint != p.shared {
			t.Errorf("still mounted after releasing c1: %s", m.Mountpoint)
		}
	}
	if err := state.Release(context.Background(), p.h, "", state.BuiltinReleasers()); err != nil {
		t.Errorf("releasing the sandbox: %v", err)
	}
	if ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(p.top)); len(ms) > 0 {
		t.Errorf("still mounted after the release: %s", ms[0].Mountpoint)
	}
	if _, err := os.Lstat(p.st.Dir("sb1")); err == nil {
		t.Errorf("sandbox directory left")
	}
	p.canary.check(t)
}

// Every planting a hostile guest could make in the tree, were it able to
// write there (the share it sees is read-only: TestShareIsReadOnly), done
// directly: release still succeeds, unmounts every recorded mount
// wherever it was moved, and touches nothing outside the sandbox.
func TestReleaseSurvivesPlantings(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name  string
		plant func(t *testing.T, p *podFixture)
	}{
		{"container dir renamed, symlink in its place", func(t *testing.T, p *podFixture) {
			c := ContainerDir(p.tree, "c1")
			must(t, os.Rename(c, c+".old"))
			must(t, os.Symlink(p.canary.dir, c))
		}},
		{"mounts dir renamed, symlink in its place", func(t *testing.T, p *podFixture) {
			m := filepath.Join(ContainerDir(p.tree, "c1"), "mounts")
			must(t, os.Rename(m, m+".old"))
			must(t, os.Symlink(filepath.Join(p.canary.dir, "mounts"), m))
		}},
		{"container dir renamed out of the tree's root, file in its place", func(t *testing.T, p *podFixture) {
			c := ContainerDir(p.tree, "c1")
			must(t, os.MkdirAll(filepath.Join(p.tree, "deep", "er"), 0o755))
			must(t, os.Rename(c, filepath.Join(p.tree, "deep", "er", "c1")))
			must(t, os.WriteFile(c, []byte("not a dir"), 0o644))
		}},
		{"container dir renamed, nothing in its place", func(t *testing.T, p *podFixture) {
			c := ContainerDir(p.tree, "c1")
			must(t, os.Rename(c, filepath.Join(p.tree, "gone")))
		}},
		{"symlinks to the canary in the tree's root and the container's dir", func(t *testing.T, p *podFixture) {
			must(t, os.Symlink(p.canary.dir, filepath.Join(p.tree, "c9")))
			must(t, os.Symlink(p.canary.file, filepath.Join(p.tree, "f9")))
			must(t, os.Symlink(p.canary.dir, filepath.Join(ContainerDir(p.tree, "c1"), "rootfs.planted")))
			must(t, os.Symlink("/", filepath.Join(ContainerDir(p.tree, "c1"), "mounts", "m9-root")))
		}},
		{"mount-looking dirs and a symlink to a file", func(t *testing.T, p *podFixture) {
			must(t, os.MkdirAll(filepath.Join(ContainerDir(p.tree, "c1"), "mounts", "m7-fake", "rootfs"), 0o755))
			must(t, os.Symlink(p.canary.file, filepath.Join(ContainerDir(p.tree, "c1"), "mounts", "m8-link")))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPod(t)
			tt.plant(t, p)
			p.releaseAndCheck(t)
			if b, err := os.ReadFile(filepath.Join(p.volume)); err == nil {
				t.Errorf("volume became a file: %q", b)
			}
		})
	}
}

// A symlink planted where the next container's directory will go: its
// create fails naming it, the rollback removes the symlink only.
func TestSymlinkPlantedBeforeCreate(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	planted := ContainerDir(p.tree, "c2")
	must(t, os.Symlink(p.canary.dir, planted))
	err := MakeContainerDir(p.h, p.tree, "c2")
	if err == nil || !strings.Contains(err.Error(), planted) || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("container dir over a planted symlink: %v", err)
	}
	// Nor can a bind be made through it.
	err = BindInto(p.h, "c2", p.tree, p.volume, filepath.Join(planted, "rootfs"), hostfs.BindOptions{})
	if err == nil {
		t.Fatal("bind through a planted symlink succeeded")
	}
	if err := state.Release(context.Background(), p.h, "c2", state.BuiltinReleasers()); err != nil {
		t.Fatalf("releasing c2: %v", err)
	}
	if _, err := os.Lstat(planted); err == nil {
		t.Errorf("planted symlink left")
	}
	p.releaseAndCheck(t)
}

// What the guest sees: the share's structure is read-only, to QEMU (root)
// too; only the binds are writable, and a read-only volume is read-only
// at the host, its submounts writable unless recursive ("rro").
func TestShareIsReadOnly(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	view := ContainerDir(p.shared, "c1")
	for _, try := range []func() error{
		func() error { return os.Mkdir(filepath.Join(p.shared, "c2"), 0o755) },
		func() error { return os.Symlink(p.canary.dir, filepath.Join(p.shared, "c2")) },
		func() error { return os.Rename(view, filepath.Join(p.shared, "c1.old")) },
		func() error { return os.Remove(filepath.Join(view, "mounts")) },
		func() error { return os.Symlink("/", filepath.Join(view, "mounts", "m9")) },
	} {
		if err := try(); err == nil {
			t.Errorf("changing the share's structure succeeded")
		}
	}
	if err := os.WriteFile(filepath.Join(view, "rootfs", "ok"), []byte("x"), 0o644); err != nil {
		t.Errorf("writing the rootfs through the share: %v", err)
	}
	if err := os.WriteFile(filepath.Join(view, "mounts", "m0-data", "ok"), []byte("x"), 0o644); err != nil {
		t.Errorf("writing a volume through the share: %v", err)
	}

	// Read-only volumes with a submount.
	ro := filepath.Join(t.TempDir(), "ro") // outside p.top: its own mount stays
	t.Cleanup(func() { unmountAllUnder(ro) })
	sub := filepath.Join(ro, "sub")
	must(t, os.MkdirAll(sub, 0o755))
	must(t, mountTmpfs(sub))
	cdir := ContainerDir(p.tree, "c1")
	must(t, BindInto(p.h, "c1", p.tree, ro, filepath.Join(cdir, "mounts", "m1-ro"), hostfs.BindOptions{ReadOnly: true}))
	must(t, BindInto(p.h, "c1", p.tree, ro, filepath.Join(cdir, "mounts", "m2-rro"), hostfs.BindOptions{ReadOnly: true, RecursiveReadOnly: true}))
	for _, c := range []struct {
		path     string
		writable bool
	}{
		{filepath.Join(view, "mounts", "m1-ro", "f"), false},
		{filepath.Join(view, "mounts", "m1-ro", "sub", "f"), true},
		{filepath.Join(view, "mounts", "m2-rro", "f"), false},
		{filepath.Join(view, "mounts", "m2-rro", "sub", "f"), false},
		{filepath.Join(cdir, "mounts", "m2-rro", "sub", "f"), false},
	} {
		err := os.WriteFile(c.path, []byte("x"), 0o644)
		if (err == nil) != c.writable {
			t.Errorf("writing %s: %v, want writable=%v", c.path, err, c.writable)
		}
	}
	p.releaseAndCheck(t)
	if ms, _ := mountinfo.GetMounts(mountinfo.SingleEntryFilter(sub)); len(ms) != 1 {
		t.Errorf("the volume's own submount was touched")
	}
}

// Bind sources that are symlinks or kernel interfaces are refused, naming
// them, and leave nothing mounted.
func TestBindSourceChecks(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	link := filepath.Join(p.top, "to-proc")
	must(t, os.Symlink("/proc", link))
	cdir := ContainerDir(p.tree, "c1")
	for i, src := range []string{link, "/proc", "/proc/self", "/sys/kernel", "/dev", "/sys/kernel/debug"} {
		err := BindInto(p.h, "c1", p.tree, src, filepath.Join(cdir, "mounts", fmt.Sprintf("m%d-bad", 10+i)), hostfs.BindOptions{})
		if err == nil || !strings.Contains(err.Error(), src) {
			t.Errorf("binding %s: %v, want a refusal naming it", src, err)
		}
	}
	p.releaseAndCheck(t)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func mountTmpfs(dir string) error {
	// mount -t tmpfs tmpfs DIR
	return unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m")
}

// rslave volumes: a host mount made later under a shared source appears
// in the guest's view; a private (default) bind does not get it. Both
// are released with nothing left.
func TestSlaveVolumePropagates(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	src := filepath.Join(t.TempDir(), "src")
	must(t, os.MkdirAll(src, 0o755))
	// mount --bind SRC SRC && mount --make-shared SRC
	must(t, unix.Mount(src, src, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unmountAllUnder(src) })
	must(t, unix.Mount("", src, "", unix.MS_SHARED, ""))
	cdir := ContainerDir(p.tree, "c1")
	must(t, BindInto(p.h, "c1", p.tree, src, filepath.Join(cdir, "mounts", "m3-slave"), hostfs.BindOptions{Slave: true}))
	must(t, BindInto(p.h, "c1", p.tree, src, filepath.Join(cdir, "mounts", "m4-private"), hostfs.BindOptions{}))
	must(t, os.Mkdir(filepath.Join(src, "new"), 0o755))
	must(t, mountTmpfs(filepath.Join(src, "new")))
	must(t, os.WriteFile(filepath.Join(src, "new", "hello"), []byte("hello"), 0o644))
	view := ContainerDir(p.shared, "c1")
	if b, err := os.ReadFile(filepath.Join(view, "mounts", "m3-slave", "new", "hello")); err != nil || string(b) != "hello" {
		t.Errorf("rslave volume: the host's later mount is not in the guest's view: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(view, "mounts", "m4-private", "new", "hello")); err == nil {
		t.Errorf("private volume: the host's later mount propagated")
	}
	p.releaseAndCheck(t)
	if b, err := os.ReadFile(filepath.Join(src, "new", "hello")); err != nil || string(b) != "hello" {
		t.Errorf("the host's own mount under the source: %q %v", b, err)
	}
}
