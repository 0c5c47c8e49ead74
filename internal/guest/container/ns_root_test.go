package container

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// applets adds busybox applets to the test rootfs.
func (e *env) applets(names ...string) {
	for _, a := range names {
		os.Symlink("busybox", filepath.Join(e.rootfs, "bin", a))
	}
}

// specWith is e.spec(terminal, args...) changed by f.
func (e *env) specWith(terminal bool, f func(*specs.Spec), args ...string) []byte {
	var s specs.Spec
	json.Unmarshal(e.spec(terminal, args...), &s)
	f(&s)
	data, _ := json.Marshal(s)
	return data
}

func waitOutput(t *testing.T, e *env, id string) string {
	t.Helper()
	out := readStream(t, e, id, "", false)
	p, _ := e.m.Process(id, "")
	p.Wait(ctx(t))
	return out
}

func inPod(sid, ctype string, pid *specs.LinuxNamespace) func(*specs.Spec) {
	return func(s *specs.Spec) {
		s.Annotations = map[string]string{annotationSandboxID: sid, annotationContainerType: ctype}
		var ns []specs.LinuxNamespace
		for _, n := range s.Linux.Namespaces {
			if n.Type != specs.PIDNamespace {
				ns = append(ns, n)
			}
		}
		if pid != nil {
			ns = append(ns, *pid)
		}
		s.Linux.Namespaces = ns
	}
}

// In POD mode (a pid namespace with a path) and NODE mode (none) a
// container joins the sandbox container's pid namespace: it sees the
// sandbox's init as PID 1 and nothing of the agent; kill -TERM 1 and
// kill -9 -1 from it leave the sandbox running.
func TestPodPidNamespace(t *testing.T) {
	e := setup(t)
	e.applets("kill", "tr")
	sb := run(t, e, "sb", e.specWith(false, inPod("sb", "sandbox", &specs.LinuxNamespace{Type: specs.PIDNamespace}), "sleep", "1000"), false)
	script := `cd /proc; for p in [0-9]*; do echo "$p $(tr '\0' ' ' < $p/cmdline)"; done; kill -TERM 1; kill -9 -1; echo survived`
	for _, tc := range []struct {
		name string
		pid  *specs.LinuxNamespace
	}{
		{"pod", &specs.LinuxNamespace{Type: specs.PIDNamespace, Path: "/proc/4242/ns/pid"}},
		{"node", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, e, tc.name, e.specWith(false, inPod("sb", "container", tc.pid), "sh", "-c", script), false)
			out := waitOutput(t, e, tc.name)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			// PID 1 is the sandbox's sleep; then the shell, its tr and
			// nothing else (no agent, no kernel thread).
			if len(lines) < 2 || lines[0] != "1 sleep 1000 " || len(lines) > 4 {
				t.Fatalf("processes seen from the pod's pid namespace:\n%s", out)
			}
			if sb.Exited() {
				t.Fatal("sandbox init died")
			}
			if err := e.m.Remove(ctx(t), tc.name, true); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A pod container whose sandbox is not in the guest is refused.
	_, err := e.m.Create(ctx(t), "orphan", e.specWith(false, inPod("nosb", "container", nil), "true"), nil, false)
	if err == nil || !strings.Contains(err.Error(), `sandbox container "nosb"`) {
		t.Fatalf("create without its sandbox: %v", err)
	}
}

// Each container has its own devpts instance: a tty container sees its
// own terminal only, and not the ones of the guest or of others.
func TestOwnDevpts(t *testing.T) {
	e := setup(t)
	e.applets("ls")
	a := run(t, e, "a", e.spec(true, "sh", "-c", "tty; sleep 1000"), false)
	_ = a
	run(t, e, "b", e.spec(true, "sh", "-c", "tty; ls /dev/pts; exec 3<>/dev/ptmx && echo ptmx-opens"), false)
	out := strings.Fields(strings.ReplaceAll(waitOutput(t, e, "b"), "\r", ""))
	if strings.Join(out, " ") != "/dev/pts/0 0 ptmx ptmx-opens" {
		t.Fatalf("tty and /dev/pts of the second container: %q", out)
	}
}

// The device cgroup: containerd's default rules let a container open
// /dev/null, create any node (as runc) but not open a block device.
func TestDeviceCgroup(t *testing.T) {
	e := setup(t)
	e.applets("mknod", "head")
	script := `probe() { if sh -c "$2" 2>/dev/null; then echo "$1 ok"; else echo "$1 denied"; fi; }
probe null 'exec 3</dev/null'
probe mknod 'mknod /tmp/b b 7 0'
probe open 'exec 3</tmp/b'`
	i := func(v int64) *int64 { return &v }
	run(t, e, "dev", e.specWith(false, func(s *specs.Spec) {
		// A default container's capabilities (containerd's), not a
		// privileged one's.
		def := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
			"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE"}
		s.Process.Capabilities = &specs.LinuxCapabilities{Bounding: def, Effective: def, Permitted: def}
		s.Linux.Resources = &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{
			{Allow: false, Access: "rwm"},
			{Allow: true, Type: "c", Major: i(1), Minor: i(3), Access: "rwm"},
		}}
	}, "sh", "-c", script), false)
	if out := strings.TrimSpace(waitOutput(t, e, "dev")); out != "null ok\nmknod ok\nopen denied" {
		t.Fatalf("device probes: %q", out)
	}
}

// The default /dev holds runc's nodes, made with mknod as runc makes them
// outside a user namespace: character devices, mode 0666, owned by root,
// and none of them a mount (a bind from the guest's /dev would be one
// mount per node, each 2-3 ms under TCG). The umask does not narrow them.
func TestDefaultDevNodes(t *testing.T) {
	e := setup(t)
	e.applets("stat", "grep", "head", "wc")
	script := `cd /dev && stat -c '%n %F %a %u:%g %t:%T' null zero full random urandom tty
grep -cE ' /dev/(null|zero|full|random|urandom|tty) ' /proc/self/mountinfo
head -c 4 /dev/urandom | wc -c; echo x > /dev/null && echo null-writes`
	umask := uint32(0o077)
	run(t, e, "devs", e.specWith(false, func(s *specs.Spec) { s.Process.User.Umask = &umask }, "sh", "-c", script), false)
	want := `null character special file 666 0:0 1:3
zero character special file 666 0:0 1:5
full character special file 666 0:0 1:7
random character special file 666 0:0 1:8
urandom character special file 666 0:0 1:9
tty character special file 666 0:0 5:0
0
4
null-writes`
	if out := strings.TrimSpace(waitOutput(t, e, "devs")); out != want {
		t.Fatalf("/dev nodes:\n%s\nwant:\n%s", out, want)
	}
}

// Mount targets are resolved inside the rootfs: a symlink to a host
// directory is followed as if the rootfs were "/". Binds are nosuid,nodev.
func TestMountTargetsInRoot(t *testing.T) {
	e := setup(t)
	e.applets("grep")
	outside := t.TempDir()
	os.Symlink(outside, filepath.Join(e.rootfs, "link"))
	src := t.TempDir()
	run(t, e, "m", e.specWith(false, func(s *specs.Spec) {
		s.Mounts = []specs.Mount{
			{Destination: "/link/tmp", Type: "tmpfs", Source: "tmpfs"},
			{Destination: "/data", Type: "bind", Source: src, Options: []string{"rbind"}},
		}
	}, "sh", "-c", "grep -E ' /data | /"+strings.TrimPrefix(outside, "/")+"/tmp ' /proc/self/mountinfo"), false)
	out := waitOutput(t, e, "m")
	if _, err := os.Stat(filepath.Join(outside, "tmp")); err == nil {
		t.Fatalf("mount point created outside the rootfs in %s", outside)
	}
	if !strings.Contains(out, " /data ") || !strings.Contains(out, "nosuid") || !strings.Contains(out, "nodev") {
		t.Fatalf("bind /data not nosuid,nodev:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(e.rootfs, outside, "tmp")); err != nil {
		t.Fatalf("mount point not created inside the rootfs: %v", err)
	}
}

// A read-only rootfs, readonly paths and masked paths hold against root.
func TestReadonlyRootfsAndPaths(t *testing.T) {
	e := setup(t)
	e.applets("touch", "head")
	os.MkdirAll(filepath.Join(e.rootfs, "ro"), 0o755)
	os.WriteFile(filepath.Join(e.rootfs, "secret"), []byte("secret\n"), 0o644)
	script := `touch /x 2>/dev/null && echo root-writable; touch /ro/x 2>/dev/null && echo ro-writable; touch /tmp/x && echo tmp-ok; head -c6 /secret; echo; echo end`
	run(t, e, "ro", e.specWith(false, func(s *specs.Spec) {
		s.Root.Readonly = true
		s.Mounts = []specs.Mount{{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"}}
		s.Linux.ReadonlyPaths = []string{"/ro"}
		s.Linux.MaskedPaths = []string{"/secret"}
	}, "sh", "-c", script), false)
	if out := waitOutput(t, e, "ro"); out != "tmp-ok\n\nend\n" {
		t.Fatalf("read-only rootfs probes: %q", out)
	}
	if err := unix.Access(filepath.Join(e.rootfs, "x"), unix.F_OK); err == nil {
		t.Fatal("/x created in the read-only rootfs")
	}
}
