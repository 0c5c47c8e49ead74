package harness

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hull-runtime/hull/internal/config"
)

// The copy withStateDir writes is the same configuration, as Hull's own
// loader reads it, with the test's state root.
func TestWithStateDir(t *testing.T) {
	dir := t.TempDir()
	orig := filepath.Join(dir, "hull.toml")
	text := "[hypervisor.qemu]\nkernel = \"/k\"\ndefault_memory = 256\n\n[runtime]\ncreate_container_timeout = 90\n"
	if err := os.WriteFile(orig, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := withStateDir(orig, dir, "/run/hull-e2e-0000abcd")
	if err != nil {
		t.Fatal(err)
	}
	if p == orig {
		t.Fatal("no copy written")
	}
	b, _ := os.ReadFile(p)
	cfg, _, err := config.Parse(p, b)
	if err != nil {
		t.Fatalf("the copy does not parse: %v\n%s", err, b)
	}
	if cfg.Runtime.StateDir != "/run/hull-e2e-0000abcd" || cfg.Runtime.CreateContainerTimeout != 90 ||
		cfg.Hypervisor.Kernel != "/k" || cfg.Hypervisor.DefaultMemory != 256 {
		t.Errorf("copy reads as %+v %+v\n%s", cfg.Runtime, cfg.Hypervisor, b)
	}
	if got, _ := os.ReadFile(orig); string(got) != text {
		t.Errorf("the original changed:\n%s", got)
	}

	// Its own state_dir, or a configuration that is not TOML: as it is.
	own := filepath.Join(dir, "own.toml")
	os.WriteFile(own, []byte("[runtime]\nstate_dir = \"/x\"\n"), 0o644)
	broken := filepath.Join(dir, "broken.toml")
	os.WriteFile(broken, []byte("[hypervisor\n"), 0o644)
	for _, path := range []string{own, broken} {
		if p, err := withStateDir(path, dir, "/run/y"); err != nil || p != path {
			t.Errorf("withStateDir(%s) = %s, %v; want it unchanged", path, p, err)
		}
	}
}
