package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckPasses(t *testing.T) {
	cfgPath, _ := hostWithGuest(t, "")
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("no /dev/net/tun on this host: hull check fails here by design")
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"check", "--config", cfgPath}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "PASS qemu:") || !strings.Contains(stdout.String(), "this host can run Hull") {
		t.Errorf("output:\n%s", stdout.String())
	}
}

func TestCheckMissingKernel(t *testing.T) {
	cfgPath, dir := hostWithGuest(t, "")
	kernel := filepath.Join(dir, "vmlinux")
	if err := os.Remove(kernel); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"check", "--config", cfgPath}, nil, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stdout.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "FAIL kernel: open "+kernel+": no such file or directory") {
		t.Errorf("output does not name the missing kernel %s:\n%s", kernel, out)
	}
	if !strings.Contains(out, "fix: build and install the guest kernel and initramfs: make guest (or hull guest build)") {
		t.Errorf("output lacks the fix:\n%s", out)
	}
}

func TestCheckQEMUMissing(t *testing.T) {
	cfgPath, dir := hostWithGuest(t, "")
	missing := filepath.Join(dir, "nowhere", "qemu-system-x86_64")
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, cfgPath, strings.Replace(string(data), "[hypervisor.qemu]\n", "[hypervisor.qemu]\npath = \""+missing+"\"\n", 1), 0o644)
	t.Setenv("PATH", t.TempDir())

	var stdout, stderr bytes.Buffer
	if code := Main([]string{"check", "--config", cfgPath}, nil, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stdout.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "FAIL qemu: "+missing+" not found") || !strings.Contains(out, "fix: apt-get install qemu-system-x86") {
		t.Errorf("output does not name QEMU and its fix:\n%s", out)
	}

	// The default, a name looked up on an empty PATH, fails the same way.
	mustWrite(t, cfgPath, string(data), 0o644)
	stdout.Reset()
	if code := Main([]string{"check", "--config", cfgPath}, nil, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if out := stdout.String(); !strings.Contains(out, "FAIL qemu: qemu-system-x86_64 not found") || !strings.Contains(out, "fix: apt-get install qemu-system-x86") {
		t.Errorf("output:\n%s", out)
	}
}

func TestCheckInvalidConfig(t *testing.T) {
	cfgPath, _ := hostWithGuest(t, "default_vcpus = 0\n")
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"check", "--config", cfgPath}, nil, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "hypervisor.qemu.default_vcpus = 0: must be at least 1") ||
		!strings.Contains(stdout.String(), "FAIL config:") {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}
