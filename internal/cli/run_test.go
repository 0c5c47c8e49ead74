package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/run"
)

func TestRunRejectsBrokenConfigNamingTheKey(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[hypervisor.qemu]\ndefault_memory = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := Main([]string{"run", "--config", cfg, "--rootfs", t.TempDir(), "--", "true"}, nil, &stdout, &stderr)
	if code != run.ExitRunFailed {
		t.Fatalf("exit %d, want %d", code, run.ExitRunFailed)
	}
	if !strings.Contains(stderr.String(), "default_memory") || !strings.Contains(stderr.String(), cfg) {
		t.Fatalf("error does not name the file and key:\n%s", stderr.String())
	}
}

func TestApplyConfigFlagsWin(t *testing.T) {
	cfg := config.Defaults()
	cfg.Hypervisor.DefaultMemory = 512
	cfg.Hypervisor.DefaultVCPUs = 2
	cfg.Hypervisor.Kernel = "/cfg/vmlinux"
	cfg.Hypervisor.Initrd = "/cfg/initrd"
	o := run.Options{MemoryMiB: 128, Kernel: "/flag/vmlinux"}
	applyConfig(&o, &cfg, map[string]bool{"memory": true, "kernel": true})
	if o.MemoryMiB != 128 || o.Kernel != "/flag/vmlinux" {
		t.Errorf("flags lost: memory %d kernel %s", o.MemoryMiB, o.Kernel)
	}
	if o.CPUs != 2 || o.Initrd != "/cfg/initrd" || o.MachineType != cfg.Hypervisor.MachineType {
		t.Errorf("config not applied: %+v", o)
	}
}

func TestExpandShortFlags(t *testing.T) {
	got := expandShortFlags([]string{"-it", "--rootfs", "x", "--", "-it"})
	want := "-i -t --rootfs x -- -it"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %q, want %q", strings.Join(got, " "), want)
	}
}
