package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/config"
)

// hostWithGuest writes a fake QEMU on PATH and a guest kernel and initrd,
// and returns a configuration file naming them (plus extra TOML lines).
func hostWithGuest(t *testing.T, extra string) (cfgPath, dir string) {
	t.Helper()
	dir = t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(bin, "qemu-system-x86_64"), "#!/bin/sh\necho 'QEMU emulator version 7.2.22 (test)'\n", 0o755)
	t.Setenv("PATH", bin)
	t.Setenv(config.EnvVar, "")
	kernel := filepath.Join(dir, "vmlinux")
	mustWrite(t, kernel, "\x7fELF....Linux version 6.1.0-test (tester) #1 SMP\x00", 0o644)
	initrd := filepath.Join(dir, "initrd.img")
	mustWrite(t, initrd, "\x1f\x8b\x08\x00gzipped", 0o644)
	cfgPath = filepath.Join(dir, "config.toml")
	mustWrite(t, cfgPath, "[hypervisor.qemu]\nkernel = \""+kernel+"\"\ninitrd = \""+initrd+"\"\ndefault_memory = 512\n"+extra, 0o644)
	return cfgPath, dir
}

func mustWrite(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func TestEnvJSON(t *testing.T) {
	cfgPath, dir := hostWithGuest(t, "enable_iommu = true\n")
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"env", "--json", "--config", cfgPath}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	var rep EnvReport
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("parsing JSON: %v\n%s", err, stdout.String())
	}
	if dec.More() {
		t.Errorf("more than one JSON value on stdout")
	}
	if rep.Version != Version || rep.Commit != Commit {
		t.Errorf("version %q commit %q", rep.Version, rep.Commit)
	}
	if rep.Config.Source.Path != cfgPath || rep.Config.Source.Origin != config.OriginExplicit {
		t.Errorf("config source %+v", rep.Config.Source)
	}
	if rep.Config.Values.Hypervisor.DefaultMemory != 512 || rep.Config.Values.Runtime.InternetworkingModel != "tcfilter" {
		t.Errorf("config values %+v", rep.Config.Values)
	}
	if len(rep.Config.Warnings) != 1 || rep.Config.Warnings[0].Key != "hypervisor.qemu.enable_iommu" || rep.Config.Warnings[0].Line != 5 {
		t.Errorf("warnings %+v", rep.Config.Warnings)
	}
	if !strings.Contains(stderr.String(), "enable_iommu") {
		t.Errorf("warning not on stderr: %q", stderr.String())
	}
	if rep.Hypervisor.Path != filepath.Join(dir, "bin", "qemu-system-x86_64") || rep.Hypervisor.Version != "7.2.22 (test)" {
		t.Errorf("hypervisor %+v", rep.Hypervisor)
	}
	if rep.Kernel.Version != "6.1.0-test" || rep.Kernel.Format != "ELF vmlinux" {
		t.Errorf("kernel %+v", rep.Kernel)
	}
	if rep.Initrd.Compression != "gzip" || rep.Initrd.Size == 0 {
		t.Errorf("initrd %+v", rep.Initrd)
	}
	if rep.Host.Accel != "kvm" && rep.Host.Accel != "tcg" || rep.Host.Cgroup == "" {
		t.Errorf("host %+v", rep.Host)
	}
	names := map[string]bool{}
	for _, c := range rep.Host.Checks {
		names[c.Name] = true
	}
	for _, n := range []string{"qemu", "kernel", "initrd", "kvm", "vhost-vsock", "landlock", "templates", "tap", "tc", "macvtap", "cgroup", "containerd"} {
		if !names[n] {
			t.Errorf("no %s in host checks", n)
		}
	}
	if rep.Containerd != "" {
		t.Errorf("containerd %q with an empty PATH", rep.Containerd)
	}
}

func TestEnvText(t *testing.T) {
	cfgPath, _ := hostWithGuest(t, "")
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"env", "--config", cfgPath}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr.String())
	}
	for _, want := range []string{"hull " + Version, "config: " + cfgPath, "default_memory = 512", "version: 7.2.22 (test)", "6.1.0-test", "accelerator:", "containerd: not found"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestEnvInvalidConfig(t *testing.T) {
	cfgPath, _ := hostWithGuest(t, "shared_fs = \"nfs\"\n")
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"env", "--json", "--config", cfgPath}, nil, &stdout, &stderr); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if want := cfgPath + `:5: hypervisor.qemu.shared_fs = "nfs": must be one of`; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr %q lacks %q", stderr.String(), want)
	}
}
