package storage

import (
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/hull-runtime/hull/internal/hostfs"
)

func criSpec() *specs.Spec {
	return &specs.Spec{
		Process:  &specs.Process{Args: []string{"sh"}},
		Root:     &specs.Root{Path: "rootfs", Readonly: true},
		Hostname: "",
		Hooks:    &specs.Hooks{},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/cri/sandboxes/s1/hosts", Options: []string{"rbind", "rprivate", "rw"}},
			{Destination: "/etc/resolv.conf", Source: "/var/lib/cri/sandboxes/s1/resolv.conf", Options: []string{"rbind", "ro"}},
			{Destination: "/dev/shm", Type: "bind", Source: "/run/cri/sandboxes/s1/shm", Options: []string{"rbind"}},
			{Destination: "/dev/fuse", Type: "bind", Source: "/dev/fuse", Options: []string{"rbind"}},
			{Destination: "/data", Type: "bind", Source: "/srv/vol/", Options: []string{"rbind"}},
			{Destination: "/weird", Type: "overlay", Source: "overlay"},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace, Path: "/var/run/netns/cni-1"},
				{Type: specs.IPCNamespace, Path: "/proc/42/ns/ipc"},
				{Type: specs.UTSNamespace, Path: "/proc/42/ns/uts"},
				{Type: specs.MountNamespace},
			},
			Devices: []specs.LinuxDevice{{Path: "/dev/kvm"}},
		},
	}
}

func TestGuestSpec(t *testing.T) {
	in := criSpec()
	p, err := GuestSpec(in, "c1", "/run/hull/s1/shared", "pod-host")
	if err != nil {
		t.Fatal(err)
	}
	s := p.Spec
	if s.Root.Path != "/run/hull/shared/c1/rootfs" || !s.Root.Readonly {
		t.Errorf("root = %+v", s.Root)
	}
	if p.RootfsTarget != "/run/hull/s1/shared/c1/rootfs" {
		t.Errorf("rootfs target = %s", p.RootfsTarget)
	}
	if s.Hooks != nil {
		t.Error("hooks kept")
	}
	if s.Hostname != "pod-host" {
		t.Errorf("hostname = %q", s.Hostname)
	}
	got := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		got[m.Destination] = m
	}
	for _, d := range []string{"/dev/fuse", "/weird"} {
		if _, ok := got[d]; ok {
			t.Errorf("mount %s should be dropped", d)
		}
	}
	if m := got["/proc"]; m.Type != "proc" {
		t.Errorf("/proc = %+v", m)
	}
	if m := got["/sys/fs/cgroup"]; m.Type != "cgroup" {
		t.Errorf("cgroup mount = %+v", m)
	}
	if m := got["/dev/shm"]; m.Source != GuestShmDir || m.Type != "bind" {
		t.Errorf("/dev/shm = %+v", m)
	}
	if m := got["/etc/hosts"]; m.Source != "/run/hull/shared/c1/mounts/m2-hosts" || m.Type != "bind" {
		t.Errorf("/etc/hosts = %+v", m)
	}
	if len(p.Binds) != 3 {
		t.Fatalf("binds = %+v", p.Binds)
	}
	want := []Bind{
		{Source: "/var/lib/cri/sandboxes/s1/hosts", Target: "/run/hull/s1/shared/c1/mounts/m2-hosts", GuestPath: "/run/hull/shared/c1/mounts/m2-hosts"},
		{Source: "/var/lib/cri/sandboxes/s1/resolv.conf", Target: "/run/hull/s1/shared/c1/mounts/m3-resolv.conf", GuestPath: "/run/hull/shared/c1/mounts/m3-resolv.conf", Options: hostfs.BindOptions{ReadOnly: true}},
		{Source: "/srv/vol", Target: "/run/hull/s1/shared/c1/mounts/m6-data", GuestPath: "/run/hull/shared/c1/mounts/m6-data"},
	}
	for i, b := range want {
		if p.Binds[i] != b {
			t.Errorf("bind %d = %+v, want %+v", i, p.Binds[i], b)
		}
	}
	ns := map[specs.LinuxNamespaceType]specs.LinuxNamespace{}
	for _, n := range s.Linux.Namespaces {
		ns[n.Type] = n
	}
	if n := ns[specs.UTSNamespace]; n.Path != "" {
		t.Errorf("uts namespace keeps host path %q", n.Path)
	}
	if n := ns[specs.NetworkNamespace]; n.Path == "" {
		t.Error("network namespace lost its path: the agent would make a new, empty one")
	}
	if len(s.Linux.Devices) != 0 {
		t.Error("host devices kept")
	}
	// The input is not modified.
	if in.Root.Path != "rootfs" || in.Hooks == nil || len(in.Mounts) != 8 || in.Linux.Namespaces[3].Path == "" || len(in.Linux.Devices) != 1 {
		t.Error("GuestSpec modified its input")
	}
}

func TestGuestSpecKeepsHostname(t *testing.T) {
	in := criSpec()
	in.Hostname = "own"
	p, err := GuestSpec(in, "c1", "/s", "pod-host")
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Hostname != "own" {
		t.Errorf("hostname = %q", p.Spec.Hostname)
	}
}

func TestGuestSpecRejectsNoProcess(t *testing.T) {
	if _, err := GuestSpec(&specs.Spec{}, "c1", "/s", ""); err == nil {
		t.Error("no error for a spec without process")
	}
}

func TestSanitize(t *testing.T) {
	for in, want := range map[string]string{"hosts": "hosts", "/": "root", "a b:c": "a_b_c", "..": "root"} {
		if got := sanitize(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestGuestSpecBindOptionsAndRefusals(t *testing.T) {
	spec := func(ms ...specs.Mount) *specs.Spec {
		return &specs.Spec{Process: &specs.Process{}, Mounts: ms}
	}
	p, err := GuestSpec(spec(
		specs.Mount{Destination: "/a", Type: "bind", Source: "/srv/a", Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/b", Type: "bind", Source: "/srv/b", Options: []string{"rbind", "rro"}},
		specs.Mount{Destination: "/c", Type: "bind", Source: "/srv/c", Options: []string{"rbind", "rslave"}},
		specs.Mount{Destination: "/fuse", Type: "bind", Source: "/dev/fuse", Options: []string{"rbind"}},
	), "c1", "/run/hull/s1/tree", "h")
	if err != nil {
		t.Fatal(err)
	}
	want := []hostfs.BindOptions{{ReadOnly: true}, {ReadOnly: true, RecursiveReadOnly: true}, {Slave: true}}
	if len(p.Binds) != len(want) {
		t.Fatalf("binds = %+v", p.Binds)
	}
	for i, o := range want {
		if p.Binds[i].Options != o {
			t.Errorf("bind %s: options %+v, want %+v", p.Binds[i].Source, p.Binds[i].Options, o)
		}
	}
	// "ro" is the host's (its top mount read-only, submounts writable):
	// in the guest the volume and its host submounts are one 9p tree, so a
	// read-only remount there would cover the submounts too. "rro" stays.
	guestOpts := map[string][]string{}
	for _, m := range p.Spec.Mounts {
		guestOpts[m.Destination] = m.Options
	}
	if o := guestOpts["/a"]; slices.Contains(o, "ro") || !slices.Contains(o, "rbind") {
		t.Errorf("guest options of a non-recursive read-only bind: %v", o)
	}
	if o := guestOpts["/b"]; !slices.Contains(o, "rro") {
		t.Errorf("guest options of a recursive read-only bind: %v", o)
	}
	for _, src := range []string{"/proc", "/proc/1/root", "/sys", "/sys/kernel/debug", "/dev"} {
		_, err := GuestSpec(spec(specs.Mount{Destination: "/host", Type: "bind", Source: src, Options: []string{"rbind"}}), "c1", "/run/hull/s1/tree", "h")
		if err == nil || !strings.Contains(err.Error(), src) {
			t.Errorf("bind of %s: %v, want a refusal naming it", src, err)
		}
	}
}
