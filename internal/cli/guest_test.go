package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGuestBuildKernelChoice(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kernel", "hull"}, "--kernel hull needs --kernel-dir"},
		{[]string{"--kernel", "debian", "--kernel-dir", "/k"}, "--kernel debian with --kernel-dir /k"},
		{[]string{"--kernel", "custom"}, `--kernel "custom": want hull or debian`},
	} {
		out := filepath.Join(dir, "out")
		var stdout, stderr bytes.Buffer
		args := append([]string{"guest", "build", "--agent", "/nonexistent", "--out", out}, c.args...)
		if code := Main(args, nil, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q, want %q", c.args, code, stderr.String(), c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%q: created %s", c.args, out)
		}
	}
}
