package initsys

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMoveTreeCopiesKeepsLinksAndDrops(t *testing.T) {
	src := t.TempDir()
	dst := filepath.Join(src, ".hull-root")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "etc/hull"), 0o755))
	must(os.WriteFile(filepath.Join(src, "etc/hull/modules"), []byte("list\n"), 0o644))
	must(os.WriteFile(filepath.Join(src, "init"), []byte("agent"), 0o755))
	must(os.MkdirAll(filepath.Join(src, "lib/modules/6.1"), 0o755))
	must(os.WriteFile(filepath.Join(src, "lib/modules/6.1/virtio.ko"), []byte("ko"), 0o644))
	must(os.Symlink("etc/hull/modules", filepath.Join(src, "link")))
	must(os.Mkdir(dst, 0o755))

	must(os.WriteFile(filepath.Join(src, "agent"), []byte("self"), 0o755))

	must(moveTree(src, dst, filepath.Join(src, "agent"), []string{filepath.Join(src, "init"), filepath.Join(src, "lib/modules")}))

	if b, err := os.ReadFile(filepath.Join(dst, "etc/hull/modules")); err != nil || string(b) != "list\n" {
		t.Errorf("etc/hull/modules not moved: %q %v", b, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "etc/hull/modules" {
		t.Errorf("symlink not kept: %q %v", l, err)
	}
	for _, p := range []string{"init", "lib/modules"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !os.IsNotExist(err) {
			t.Errorf("dropped %s was copied", p)
		}
		if _, err := os.Lstat(filepath.Join(src, p)); !os.IsNotExist(err) {
			t.Errorf("dropped %s was not removed from the old root", p)
		}
	}
	if _, err := os.Lstat(filepath.Join(src, "etc/hull/modules")); !os.IsNotExist(err) {
		t.Errorf("original left in the old root")
	}
	// The running binary stays where it is, and only there.
	if b, err := os.ReadFile(filepath.Join(src, "agent")); err != nil || string(b) != "self" {
		t.Errorf("kept agent not left in the old root: %q %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "agent")); !os.IsNotExist(err) {
		t.Errorf("kept agent was copied")
	}
}

// TestMoveTreeLeavesDeviceNodes: a device node is made in the new root
// and left in the old one (the kernel's /dev/console is open as PID 1's
// stdio; removed, it would keep the initramfs from going read-only).
func TestMoveTreeLeavesDeviceNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	src := t.TempDir()
	dst := filepath.Join(src, ".hull-root")
	if err := os.MkdirAll(filepath.Join(src, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	// mknod SRC/dev/console c 5 1
	if err := unix.Mknod(filepath.Join(src, "dev/console"), unix.S_IFCHR|0o600, int(unix.Mkdev(5, 1))); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := moveTree(src, dst, "", nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dst, "dev/console"), filepath.Join(src, "dev/console")} {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Errorf("%s: %v", p, err)
		} else if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(5, 1) {
			t.Errorf("%s: mode %#o rdev %#x, want the console's node", p, st.Mode, st.Rdev)
		}
	}
}
