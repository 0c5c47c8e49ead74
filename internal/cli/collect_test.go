package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCollectReportHasItsSections(t *testing.T) {
	root := t.TempDir()
	sb := filepath.Join(root, "sandbox-1")
	if err := os.MkdirAll(sb, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb, "console.log"), []byte("level=ERROR msg=\"agent failed\" err=boom\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfg, []byte("[hypervisor.qemu]\ndefault_memory = 512\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := Main([]string{"collect", "--root", root, "--config", cfg}, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	report := out.String()
	for _, want := range []string{
		"# Hull collect report",
		"## Environment and configuration (`hull env`)",
		"default_memory = 512",
		"## Host requirements (`hull check`)",
		"## Sandboxes (`hull ps`)",
		"## What `hull gc --dry-run` would remove",
		"## Versions",
		"console.log of sandbox sandbox-1",
		"agent failed",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

func TestRedact(t *testing.T) {
	in := "path = \"/usr/bin/qemu\"\n  registry_token = \"abc123\"\nPASSWORD: hunter2"
	got := redact(in)
	if strings.Contains(got, "abc123") || strings.Contains(got, "hunter2") {
		t.Fatalf("secret kept:\n%s", got)
	}
	if !strings.Contains(got, "registry_token = <redacted>") || !strings.Contains(got, "/usr/bin/qemu") {
		t.Fatalf("redaction too broad or missing:\n%s", got)
	}
}
