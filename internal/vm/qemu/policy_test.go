package qemu

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/fsguard"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/internal/vm"
)

// QEMU's files: what it opens while starting, each share as the guest
// may use it, a template's file as the VM uses it; nothing of its
// directory.
func TestPolicy(t *testing.T) {
	name := map[fsguard.Access]string{fsguard.Read: "read", fsguard.Exec: "exec", fsguard.Write: "write",
		fsguard.Own: "own"}
	rules := func(cfg vm.Config) []string {
		var r []string
		p := policy(cfg, AccelTCG, "/run/hull/sb/qemu-root")
		if p.Root != "/run/hull/sb/qemu-root" || p.Workdir != cfg.Dir {
			t.Errorf("root %q, working directory %q; want /run/hull/sb/qemu-root, %s", p.Root, p.Workdir, cfg.Dir)
		}
		for _, rule := range p.Rules {
			if strings.HasPrefix(rule.Path, "/lib") {
				continue // the host's, where not merged into /usr
			}
			r = append(r, fmt.Sprintf("%s %s", name[rule.Access], rule.Path))
		}
		slices.Sort(r)
		return r
	}
	base := []string{"exec /usr", "read /etc/ld.so.cache", "write /dev/null", "read /dev/urandom",
		"exec /usr/bin/qemu-system-x86_64", "read /k"}
	for _, c := range []struct {
		name string
		cfg  vm.Config
		more []string
	}{
		{"pod", vm.Config{Binary: "/usr/bin/qemu-system-x86_64", Kernel: "/k", Initrd: "/i", Firmware: "/usr/share/qemu/qboot.rom",
			Dir: "/run/hull/sb", Shares: []vm.Share{{Tag: "a", HostPath: "/run/hull/sb/shared"}, {Tag: "b", HostPath: "/ro", ReadOnly: true}}},
			[]string{"read /i", "read /usr/share/qemu/qboot.rom", "own /run/hull/sb/shared", "read /ro"}},
		{"clone", vm.Config{Binary: "/usr/bin/qemu-system-x86_64", Kernel: "/k", Dir: "/run/hull/sb",
			Memory: &vm.MemoryFile{Path: "/t/memory"}}, []string{"read /t/memory"}},
		{"template build", vm.Config{Binary: "/usr/bin/qemu-system-x86_64", Kernel: "/k", Dir: "/run/hull/sb",
			Memory: &vm.MemoryFile{Path: "/t/memory", Shared: true}}, []string{"own /t/memory"}},
	} {
		want := append(slices.Clone(base), c.more...)
		slices.Sort(want)
		if got := rules(c.cfg); !slices.Equal(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, want)
		}
	}
	// A clone's template memory, opened for writing, is given read-only;
	// nothing else is.
	clone := vm.Config{Binary: "/usr/bin/qemu-system-x86_64", Kernel: "/k", Dir: "/run/hull/sb", Memory: &vm.MemoryFile{Path: "/t/memory"}}
	if got := policy(clone, AccelTCG, "/r").ReadOnlyOpens; !slices.Equal(got, []string{"/t/memory"}) {
		t.Errorf("clone: opened read-only %q, want the template's memory alone", got)
	}
	clone.Memory.Shared = true
	if got := policy(clone, AccelTCG, "/r").ReadOnlyOpens; got != nil {
		t.Errorf("template build: opened read-only %q, want none", got)
	}
	// Under KVM, QEMU opens /dev/kvm.
	kvm := policy(vm.Config{Binary: "/usr/bin/qemu-system-x86_64", Kernel: "/k", Dir: "/run/hull/sb"}, AccelKVM, "/r")
	if !slices.Contains(kvm.Rules, fsguard.Rule{Path: "/dev/kvm", Access: fsguard.Write}) {
		t.Errorf("kvm: %v lacks /dev/kvm", kvm.Rules)
	}
	// A QEMU installed under a prefix of its own reads and runs what is
	// beside its bin; one in a directory that is not a bin gets nothing
	// around it.
	cfg := vm.Config{Binary: "/opt/qemu/bin/qemu-system-x86_64", Kernel: "/k", Dir: "/run/hull/sb"}
	if got := rules(cfg); !slices.Contains(got, "exec /opt/qemu") {
		t.Errorf("/opt/qemu/bin: %q lacks exec /opt/qemu", got)
	}
	cfg.Binary = "/run/hull/qemu"
	if got := rules(cfg); slices.Contains(got, "exec /run/hull") || slices.Contains(got, "exec /run") {
		t.Errorf("/run/hull/qemu: %q reaches beyond the binary", got)
	}
}

// openEnv makes the test binary open the file it names for reading and
// writing, and print the outcome (TestMain).
const openEnv = "HULL_QEMU_TEST_OPEN"

// Under KVM, QEMU opens /dev/kvm: its policy has it (a QEMU under TCG's
// has not), with the real confinement. Without it every pod failed on a
// KVM host.
func TestKVMPolicyOpensDevKVM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root test")
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("no /dev/kvm on this host")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for accel, want := range map[string]string{AccelKVM: "ok", AccelTCG: "no such file or directory"} {
		dir := t.TempDir()
		root := filepath.Join(dir, rootName)
		if err := os.Mkdir(root, 0o500); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), openEnv+"=/dev/kvm")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		done := make(chan struct{})
		if _, err := spawn(cmd, policy(vm.Config{Binary: self, Kernel: self, Dir: dir}, accel, root), done); err != nil {
			t.Fatal(err)
		}
		err := cmd.Wait()
		close(done)
		if got := testenv.ParseOutcomes(out.String())["open"]; err != nil || got != want {
			t.Errorf("%s: opening /dev/kvm: %q (%v, %s), want %q", accel, got, err, out.String(), want)
		}
	}
}
