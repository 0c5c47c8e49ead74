package hostile

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/internal/mountinfo"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// canary is a host directory and file outside every sandbox that planted
// symlinks point at; they must stay byte-identical.
type canary struct{ dir, file, sum string }

func newCanary(t *testing.T, top string) *canary {
	t.Helper()
	c := &canary{dir: filepath.Join(top, "canary"), file: filepath.Join(top, "canary-file")}
	if err := os.MkdirAll(filepath.Join(c.dir, "mounts", "m0-data"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(c.dir, "precious"), "precious dir content")
	writeFile(t, filepath.Join(c.dir, "mounts", "m0-data", "x"), "precious data")
	writeFile(t, c.file, "precious file")
	c.sum = leakcheck.TreeDigest(c.dir, c.file)
	return c
}

func (c *canary) check(t *testing.T) {
	t.Helper()
	if got := leakcheck.TreeDigest(c.dir, c.file); got != c.sum {
		t.Errorf("the canary outside the sandbox changed: %s", got)
	}
}

// TestHostilePlantings plants what a compromised guest would, first in
// the directory QEMU exports (what its 9p server does on the guest's
// behalf) and from a privileged container that mounts the 9p tag itself:
// both must be refused (the share's structure is read-only). Then, as if
// that wall had fallen, the same plantings directly in the host's private
// tree: the pod must still stop and be removed, release every mount,
// and touch nothing outside its directory.
func TestHostilePlantings(t *testing.T) {
	e := newEnv(t)
	c := newCanary(t, e.dir)
	vol := filepath.Join(e.dir, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	p := e.runPod("plantings")
	mounts := []*runtime.Mount{{ContainerPath: "/vol", HostPath: vol}}
	a := e.mustCreate(p, "a", false, mounts)
	b := e.mustCreate(p, "b", false, mounts)
	priv := e.mustCreate(p, "priv", true, nil)
	share := filepath.Join(e.ctd.StateDir, p.ID, "shared")
	tree := filepath.Join(e.ctd.StateDir, p.ID, "tree")

	t.Run("ExportedDirectory", func(t *testing.T) {
		ca := filepath.Join(share, a)
		for what, try := range map[string]func() error{
			"rename a container's dir":        func() error { return os.Rename(ca, ca+".old") },
			"symlink in the share's root":     func() error { return os.Symlink(c.dir, filepath.Join(share, "planted")) },
			"symlink in a container's dir":    func() error { return os.Symlink(c.dir, filepath.Join(ca, "planted")) },
			"symlink in mounts/":              func() error { return os.Symlink("/", filepath.Join(ca, "mounts", "m99-root")) },
			"rename mounts/":                  func() error { return os.Rename(filepath.Join(ca, "mounts"), filepath.Join(ca, "mounts.old")) },
			"file in the share's root":        func() error { return os.WriteFile(filepath.Join(share, "f"), nil, 0o644) },
			"mount-looking dir":               func() error { return os.Mkdir(filepath.Join(ca, "mounts", "m98-x"), 0o755) },
			"remove a container's rootfs dir": func() error { return unix.Rmdir(filepath.Join(ca, "rootfs")) },
		} {
			if err := try(); err == nil {
				t.Errorf("%s in the exported directory succeeded", what)
			} else if !strings.Contains(err.Error(), "read-only") && !strings.Contains(err.Error(), "busy") {
				t.Errorf("%s in the exported directory: %v, want EROFS", what, err)
			}
		}
		// The leaves stay the guest's: its rootfs is writable.
		if err := os.WriteFile(filepath.Join(ca, "rootfs", "from-host-view"), []byte("x"), 0o644); err != nil {
			t.Errorf("writing a's rootfs through the share: %v", err)
		}
	})

	t.Run("SandboxImageNotShared", func(t *testing.T) {
		// Hull's pause uses nothing of the sandbox image
		// (docs/sandbox.md): its rootfs is neither mounted on the host
		// nor exported to the guest.
		if _, err := os.Lstat(filepath.Join(share, p.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the sandbox container has a directory in the exported share: %v", err)
		}
		ms, err := mountinfo.Read()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ms {
			if strings.HasSuffix(m.MountPoint, "/"+p.ID+"/rootfs") {
				t.Errorf("the sandbox image's rootfs is mounted on the host: %s", m.MountPoint)
			}
		}
	})

	t.Run("FromTheGuest", func(t *testing.T) {
		// Routes to the share: the 9p tag mounted again, or the agent's
		// own mount through /proc/1/root. Where one is open, what the
		// guest may do through it is checked below; where both are
		// closed, each must be closed for its reason: the guest kernel
		// refuses a second mount of one virtio-9p channel (EBUSY), and
		// the pod's PID 1 is Hull's pause, whose root holds nothing of
		// the guest (docs/sandbox.md).
		m := "/m"
		out, code := e.sh(priv, "mkdir -p /m && mount -t 9p -o trans=virtio,version=9p2000.L hullshared /m 2>&1 && echo MOUNTED")
		if code != 0 || !strings.Contains(out, "MOUNTED") {
			t.Logf("mounting the 9p tag from a privileged container: exit %d: %s", code, out)
			if !strings.Contains(strings.ToLower(out), "busy") {
				t.Errorf("mounting the 9p tag again from a privileged container: %s (exit %d), want EBUSY", out, code)
			}
			m = "/proc/1/root/run/hull/shared"
			if out, code := e.sh(priv, "ls "+m+"/"+a+" 2>&1"); code != 0 {
				root, _ := e.sh(priv, "ls -A /proc/1/root 2>&1")
				if root != "pause" {
					t.Errorf("the pod's PID 1's root lists %q, want only Hull's pause", root)
				}
				t.Logf("no route to the share from a privileged container: %s", out)
				return
			}
		}
		t.Logf("the guest reaches the share at %s", m)
		for _, cmd := range []string{
			"mv " + m + "/" + a + " " + m + "/" + a + ".old",
			"ln -s /etc " + m + "/planted",
			"ln -s /etc " + m + "/" + a + "/mounts/m99-etc",
			"mkdir " + m + "/" + b + "/mounts/m98-x",
			"mv " + m + "/" + b + "/mounts " + m + "/" + b + "/mounts.old",
			"rmdir " + m + "/" + b + "/rootfs",
			"touch " + m + "/file",
		} {
			if out, code := e.sh(priv, cmd+" 2>&1"); code == 0 {
				t.Errorf("guest: %s succeeded", cmd)
			} else if !strings.Contains(strings.ToLower(out), "read-only") && !strings.Contains(strings.ToLower(out), "busy") {
				t.Errorf("guest: %s: %s, want a read-only file system", cmd, out)
			} else {
				t.Logf("guest: %s: %s", cmd, out)
			}
		}
		if out, code := e.sh(priv, "echo from-guest > "+m+"/"+a+"/rootfs/written && cat "+m+"/"+a+"/rootfs/written"); code != 0 || out != "from-guest" {
			t.Errorf("guest: writing a's rootfs through the share: %s (exit %d)", out, code)
		}
		e.sh(priv, "umount /m 2>/dev/null; true")
	})

	t.Run("SymlinkBeforeCreate", func(t *testing.T) {
		// The container's id is known before its task (and so its
		// directory) is created: a symlink to the canary where the
		// directory will go must fail the start, naming it, and be
		// removed, not followed, by the rollback.
		id, err := e.createOnly(p, "late", false, mounts)
		if err != nil {
			t.Fatal(err)
		}
		planted := filepath.Join(tree, id)
		if err := os.Symlink(c.dir, planted); err != nil {
			t.Fatal(err)
		}
		err = e.start(id)
		if err == nil || !strings.Contains(err.Error(), planted) {
			t.Errorf("start over a planted symlink: %v, want an error naming %s", err, planted)
		} else {
			t.Logf("start refused: %v", err)
		}
		if _, err := os.Lstat(planted); err == nil {
			t.Errorf("the planted symlink %s is left after the failed start", planted)
		}
		if out, code := e.sh(b, "echo healthy"); code != 0 || out != "healthy" {
			t.Errorf("the pod after the refusal: %q exit %d", out, code)
		}
	})

	t.Run("PrivateTree", func(t *testing.T) {
		ta, tb := filepath.Join(tree, a), filepath.Join(tree, b)
		steps := []error{
			// a's directory renamed away with its mounts, a symlink in its place
			os.Rename(ta, ta+".old"),
			os.Symlink(c.dir, ta),
			// b's mounts/ renamed away, a symlink in its place
			os.Rename(filepath.Join(tb, "mounts"), filepath.Join(tb, "mounts.old")),
			os.Symlink(filepath.Join(c.dir, "mounts"), filepath.Join(tb, "mounts")),
			// share-root entries: symlinks, a file, a mount-looking dir
			os.Symlink(c.file, filepath.Join(tree, "f9")),
			os.Symlink("/", filepath.Join(tree, "c9")),
			os.WriteFile(filepath.Join(tree, "file"), []byte("x"), 0o644),
			os.MkdirAll(filepath.Join(tb, "mounts.old", "m97-x", "rootfs"), 0o755),
		}
		for i, err := range steps {
			if err != nil {
				t.Fatalf("planting step %d: %v", i, err)
			}
		}
	})

	e.removeAndCheck(p)
	c.check(t)
	if _, err := os.Stat(vol); err != nil {
		t.Errorf("the volume is gone: %v", err)
	}
}

// TestHostileGuestFiles: setuid files and device nodes made by guest
// root, in a rootfs and in a hostPath volume, are neither on the host;
// hostPath volumes that are symlinks to /proc, /sys, /dev are refused
// naming the path and the pod stays healthy; a read-only volume is
// read-only for the guest and at the host.
func TestHostileGuestFiles(t *testing.T) {
	e := newEnv(t)
	vol := filepath.Join(e.dir, "vol")
	ro := filepath.Join(e.dir, "ro")
	for _, d := range []string{vol, ro} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(ro, "config"), "read-only\n")
	p := e.runPod("files")
	id := e.mustCreate(p, "root", true, []*runtime.Mount{
		{ContainerPath: "/vol", HostPath: vol},
		{ContainerPath: "/ro", HostPath: ro, Readonly: true},
	})

	t.Run("SetuidAndDevices", func(t *testing.T) {
		script := `set -x
for d in / /vol/; do
  cp /bin/busybox ${d}suid && chown 0:0 ${d}suid && chmod 4755 ${d}suid
  mknod ${d}blk b 7 0
  mknod ${d}chr c 1 3
done
ls -ln /suid /blk /vol/suid /vol/blk`
		out, code := e.sh(id, script)
		t.Logf("guest (exit %d):\n%s", code, out)
		rootfs := filepath.Join(e.ctd.StateDir, p.ID, "tree", id, "rootfs")
		for _, dir := range []string{rootfs, vol} {
			for _, name := range []string{"suid", "blk", "chr"} {
				path := filepath.Join(dir, name)
				var st unix.Stat_t
				if err := unix.Lstat(path, &st); err != nil {
					if name == "suid" {
						t.Errorf("%s: %v: the guest's copy did not reach the host", path, err)
					}
					t.Logf("%s: %v (not created on the host)", path, err)
					continue
				}
				typ := st.Mode & unix.S_IFMT
				if typ == unix.S_IFBLK || typ == unix.S_IFCHR {
					t.Errorf("%s is a device node on the host (mode %#o)", path, st.Mode)
				}
				if st.Mode&unix.S_ISUID != 0 && st.Uid == 0 {
					t.Errorf("%s is setuid-root on the host (mode %#o)", path, st.Mode)
				}
				if st.Mode&unix.S_ISGID != 0 && st.Gid == 0 {
					t.Errorf("%s is setgid-root on the host (mode %#o)", path, st.Mode)
				}
			}
		}
	})

	t.Run("ReadOnlyVolume", func(t *testing.T) {
		if out, code := e.sh(id, "echo x > /ro/config"); code == 0 {
			t.Errorf("writing a read-only volume from the guest succeeded: %s", out)
		}
		// Guest root could remount its own bind: the host's mount is
		// what holds.
		e.sh(id, "mount -o remount,rw /ro 2>&1; echo y > /ro/config 2>&1")
		if b, _ := os.ReadFile(filepath.Join(ro, "config")); string(b) != "read-only\n" {
			t.Errorf("the read-only volume changed on the host: %q", b)
		}
		found := false
		b, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 5 && strings.HasPrefix(f[4], filepath.Join(e.ctd.StateDir, p.ID, "tree", id, "mounts")+"/") && strings.HasSuffix(f[4], "-ro") {
				found = true
				if !strings.Contains(","+f[5]+",", ",ro,") {
					t.Errorf("host mount %s of the read-only volume is %s", f[4], f[5])
				}
			}
		}
		if !found {
			t.Errorf("no host mount of the read-only volume found")
		}
	})

	t.Run("KernelInterfaceVolumes", func(t *testing.T) {
		for i, target := range []string{"/proc", "/sys", "/dev"} {
			link := filepath.Join(e.dir, "link"+strings.ReplaceAll(target, "/", "-"))
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			_, err := e.create(p, fmt.Sprintf("bad%d", i), false, []*runtime.Mount{{ContainerPath: "/host", HostPath: link}})
			if err == nil {
				t.Errorf("a container with hostPath %s -> %s was created", link, target)
			} else if !strings.Contains(err.Error(), target) && !strings.Contains(err.Error(), link) {
				t.Errorf("hostPath %s -> %s: %v, want an error naming the path", link, target, err)
			} else {
				t.Logf("hostPath %s -> %s refused: %v", link, target, err)
			}
		}
		ok := e.mustCreate(p, "after", false, nil)
		if out, code := e.sh(ok, "echo healthy"); code != 0 || out != "healthy" {
			t.Errorf("the pod after the refusals: %q exit %d", out, code)
		}
	})

	e.removeAndCheck(p)
}

// plantAndKill runs a pod with a container, plants in the tree as in
// TestHostilePlantings/PrivateTree, and SIGKILLs the pod's shim and QEMU
// (containerd first when killContainerd), so that no shim releases
// anything.
func plantAndKill(t *testing.T, e *env, c *canary, name string, killContainerd bool) *pod {
	t.Helper()
	vol := filepath.Join(e.dir, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	p := e.runPod(name)
	a := e.mustCreate(p, "a", false, []*runtime.Mount{{ContainerPath: "/vol", HostPath: vol}})
	tree := filepath.Join(e.ctd.StateDir, p.ID, "tree")
	ta := filepath.Join(tree, a)
	for i, err := range []error{
		os.Rename(ta, ta+".old"),
		os.Symlink(c.dir, ta),
		os.Symlink("/", filepath.Join(tree, "c9")),
	} {
		if err != nil {
			t.Fatalf("planting step %d: %v", i, err)
		}
	}
	shim, ok := e.ctd.PodShim(p.ID)
	if !ok {
		t.Fatalf("no shim of pod %s", p.ID)
	}
	qemu, ok := e.ctd.PodQEMU(p.ID)
	if !ok {
		t.Fatalf("no QEMU of pod %s", p.ID)
	}
	if killContainerd {
		if err := e.ctd.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	for _, pid := range []int{shim.Pid, qemu.Pid} {
		unix.Kill(pid, unix.SIGKILL)
		if _, err := harness.WaitGone(pid, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// checkReleased fails unless the sandbox's directory and every mount of
// it under e's state root are gone (waiting up to wait) and the canary is
// intact.
func checkReleased(t *testing.T, e *env, p *pod, c *canary, by string, wait time.Duration) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		_, err := os.Lstat(filepath.Join(e.ctd.StateDir, p.ID))
		var left []string
		for _, m := range mountsNaming(p.ID) {
			if strings.HasPrefix(m, e.ctd.StateDir+"/") {
				left = append(left, m)
			}
		}
		if err != nil && len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			if err == nil {
				t.Errorf("%s left %s", by, filepath.Join(e.ctd.StateDir, p.ID))
			}
			for _, m := range left {
				t.Errorf("mount left after %s: %s", by, m)
			}
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.check(t)
}

// TestHostileShimKilledThenGC: plantings, then containerd, the shim and
// QEMU SIGKILLed: `hull gc` must release the whole sandbox (every
// recorded mount, wherever it was moved), touch nothing outside it, and a
// second gc find nothing of it; after containerd's restart the pod is
// removed.
func TestHostileShimKilledThenGC(t *testing.T) {
	e := newEnv(t)
	c := newCanary(t, e.dir)
	p := plantAndKill(t, e, c, "killed-gc", true)
	out, err := exec.Command(assets.Hull, "gc", "--root", e.ctd.StateDir).CombinedOutput()
	t.Logf("hull gc:\n%s", out)
	if err != nil {
		t.Errorf("hull gc: %v", err)
	}
	checkReleased(t, e, p, c, "hull gc", 0)
	out, _ = exec.Command(assets.Hull, "gc", "--root", e.ctd.StateDir).CombinedOutput()
	if strings.Contains(string(out), p.ID) {
		t.Errorf("the second hull gc found pod %s again:\n%s", p.ID, out)
	}
	if err := e.ctd.Start(e.ctx(2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	e.removeAndCheck(p)
	c.check(t)
}

// TestHostileShimKilledThenShimDelete: plantings, then the shim and QEMU
// SIGKILLed while containerd runs: containerd's `shim delete` of the
// pod's tasks must release the whole sandbox by itself, and the pod is
// then removed.
func TestHostileShimKilledThenShimDelete(t *testing.T) {
	e := newEnv(t)
	c := newCanary(t, e.dir)
	p := plantAndKill(t, e, c, "killed-delete", false)
	checkReleased(t, e, p, c, "containerd's shim delete", 30*time.Second)
	e.removeAndCheck(p)
	c.check(t)
}
