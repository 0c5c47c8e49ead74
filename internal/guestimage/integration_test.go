package guestimage

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/hull-runtime/hull/internal/guestimage/kmod"
)

// TestBuildRealDeb builds from Debian's real kernel package. It needs
// HULL_TEST_KERNEL_DEB=/path/to/linux-image-*.deb (no network is used);
// HULL_TEST_AGENT may name a static binary to use as /init.
func TestBuildRealDeb(t *testing.T) {
	deb := os.Getenv("HULL_TEST_KERNEL_DEB")
	if deb == "" {
		t.Skip("set HULL_TEST_KERNEL_DEB to a linux-image-*-amd64 .deb (e.g. from `apt-get download linux-image-6.1.0-57-amd64`) to run")
	}
	tmp := t.TempDir()
	agent := os.Getenv("HULL_TEST_AGENT")
	if agent == "" {
		agent = fakeAgent(t, tmp)
	}
	res, err := Build(context.Background(), Options{
		AgentBinary: agent, OutDir: filepath.Join(tmp, "out"), KernelDeb: deb, Log: testLog{t},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.PVH {
		t.Error("vmlinux has no PVH entry note")
	}
	files := readInitrd(t, res.Initrd.Path)
	if _, ok := files["/init"]; !ok {
		t.Error("initramfs has no /init")
	}
	have := map[string]bool{}
	for _, p := range res.Modules {
		if _, ok := files[p]; !ok {
			t.Errorf("%s listed but missing from the initramfs", p)
		}
		name, _ := kmod.NameFromPath(p)
		have[name] = true
	}
	for _, m := range DefaultModules {
		if !have[kmod.Normalize(m)] {
			t.Errorf("wanted module %s not in the initramfs", m)
		}
	}
	t.Logf("release %s, PVH entry %#x, modules (%d): %v", res.KernelRelease, res.PVHEntry, len(res.Modules), res.Modules)
	t.Logf("vmlinux %d, vmlinuz %d, initrd %d (raw %d) bytes, %s", res.Vmlinux.Size, res.Vmlinuz.Size, res.Initrd.Size, res.InitrdRaw, res.Duration)
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p))
	return len(p), nil
}
