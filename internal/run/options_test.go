package run

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func validOptions(t *testing.T) Options {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	initrd := filepath.Join(dir, "initrd")
	for _, f := range []string{kernel, initrd} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Options{Rootfs: dir, CPUs: 1, MemoryMiB: 128, Kernel: kernel, Initrd: initrd, Args: []string{"true"}}
}

func TestValidateNamesWhatIsWrong(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*Options)
		mention string
	}{
		{"memory", func(o *Options) { o.MemoryMiB = 0 }, "--memory 0"},
		{"cpus", func(o *Options) { o.CPUs = 0 }, "--cpus 0"},
		{"rootfs", func(o *Options) { o.Rootfs = "/nonexistent/rootfs" }, "/nonexistent/rootfs"},
		{"rootfs file", func(o *Options) { o.Rootfs = o.Kernel }, "not a directory"},
		{"kernel", func(o *Options) { o.Kernel = "/nonexistent/vmlinux" }, "/nonexistent/vmlinux"},
		{"initrd", func(o *Options) { o.Initrd = "/nonexistent/initrd" }, "/nonexistent/initrd"},
		{"env", func(o *Options) { o.Env = []string{"NOEQUALS"} }, `-e "NOEQUALS"`},
		{"cwd", func(o *Options) { o.Cwd = "relative" }, `-w "relative"`},
		{"no command", func(o *Options) { o.Args = nil }, "no command"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := validOptions(t)
			c.mutate(&o)
			err := o.Validate()
			if err == nil || !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("err = %v, want it to mention %q", err, c.mention)
			}
		})
	}
	o := validOptions(t)
	if err := o.Validate(); err != nil {
		t.Fatalf("valid options rejected: %v", err)
	}
}

func TestBuildSpec(t *testing.T) {
	o := Options{Args: []string{"sh", "-c", "x"}, Env: []string{"A=1"}, TTY: true, Cwd: "/tmp"}
	b, err := buildSpec(&o)
	if err != nil {
		t.Fatal(err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	if s.Root.Path != guestRootfs || !s.Process.Terminal || s.Process.Cwd != "/tmp" {
		t.Errorf("spec = %+v", s)
	}
	if got := strings.Join(s.Process.Env, " "); !strings.Contains(got, "A=1") || !strings.Contains(got, "TERM=") || !strings.HasPrefix(got, "PATH=") {
		t.Errorf("env = %q", got)
	}
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.PIDNamespace {
			t.Errorf("one-shot command must share the guest PID namespace")
		}
	}
}
