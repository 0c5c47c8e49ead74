package hostcheck

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/fsguard"
)

func write(t *testing.T, dir, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// fakeBzImage has a setup header whose kernel_version points at banner.
func fakeBzImage(banner string) []byte {
	img := make([]byte, 8192)
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(img[0x206:], 0x020f)
	const ptr = 0x1000 // relative to 0x200
	binary.LittleEndian.PutUint16(img[0x20e:], ptr)
	copy(img[ptr+0x200:], banner+"\x00")
	return img
}

func TestKernelBzImage(t *testing.T) {
	banner := "6.1.0-18-cloud-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1"
	p := write(t, t.TempDir(), "vmlinuz", fakeBzImage(banner), 0o644)
	info, res := Kernel(p)
	if !res.OK || info.Format != "bzImage" || info.Version != "6.1.0-18-cloud-amd64" || info.Banner != banner {
		t.Errorf("info %+v result %+v", info, res)
	}
}

func TestKernelELFWithoutSections(t *testing.T) {
	// Not a parseable ELF: the probe falls back to scanning the file, and
	// the banner straddles the 1 MiB read boundary.
	data := append([]byte("\x7fELF"), bytes.Repeat([]byte{0}, 1<<20-10)...)
	data = append(data, "Linux version 6.1.0-57-amd64 (debian) #1 SMP\n\x00trailer"...)
	p := write(t, t.TempDir(), "vmlinux", data, 0o644)
	info, res := Kernel(p)
	if !res.OK || info.Format != "ELF vmlinux" || info.Version != "6.1.0-57-amd64" {
		t.Errorf("info %+v result %+v", info, res)
	}
}

func TestKernelRealFiles(t *testing.T) {
	for _, p := range []string{"/tmp/kpkg/x/boot/vmlinuz-6.1.0-57-amd64", "../../out/guest/vmlinux", "../../out/guest/vmlinuz"} {
		if _, err := os.Stat(p); err != nil {
			continue
		}
		info, res := Kernel(p)
		t.Logf("%s: %+v", p, info)
		if !res.OK || info.Version == "" || !strings.HasPrefix(info.Banner, info.Version+" ") {
			t.Errorf("%s: info %+v result %+v", p, info, res)
		}
	}
}

func TestKernelMissingOrBogus(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "vmlinux")
	_, res := Kernel(missing)
	if res.OK || !strings.Contains(res.Detail, missing) || !strings.Contains(res.Fix, "make guest") {
		t.Errorf("missing kernel: %+v", res)
	}
	bogus := write(t, dir, "bogus", []byte("hello"), 0o644)
	if _, res := Kernel(bogus); res.OK || !strings.Contains(res.Detail, "neither a bzImage nor an ELF") {
		t.Errorf("bogus kernel: %+v", res)
	}
}

func TestInitrdCompression(t *testing.T) {
	dir := t.TempDir()
	for name, magic := range map[string]string{
		"gzip": "\x1f\x8b\x08\x00", "zstd": "\x28\xb5\x2f\xfd\x00", "xz": "\xfd7zXZ\x00\x00",
		"lz4 (legacy)": "\x02\x21\x4c\x18", "none (cpio)": "070701000", "unknown format": "????",
	} {
		p := write(t, dir, strings.ReplaceAll(name, " ", "_"), []byte(magic), 0o644)
		info, res := Initrd(p)
		if !res.OK || info.Compression != name || info.Size != int64(len(magic)) {
			t.Errorf("%s: info %+v result %+v", name, info, res)
		}
	}
	if _, res := Initrd(filepath.Join(dir, "absent")); res.OK || !strings.Contains(res.Fix, "make guest") {
		t.Errorf("missing initrd: %+v", res)
	}
}

func TestQEMU(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "qemu-system-x86_64", []byte("#!/bin/sh\necho 'QEMU emulator version 9.9.9 (test)'\necho Copyright\n"), 0o755)
	t.Setenv("PATH", dir)
	info, res := QEMU(context.Background(), "qemu-system-x86_64")
	if !res.OK || info.Version != "9.9.9 (test)" || info.Path != filepath.Join(dir, "qemu-system-x86_64") {
		t.Errorf("info %+v result %+v", info, res)
	}

	t.Setenv("PATH", t.TempDir())
	if _, res := QEMU(context.Background(), "qemu-system-x86_64"); res.OK || res.Fix != qemuFix ||
		!strings.Contains(res.Detail, "qemu-system-x86_64 not found") {
		t.Errorf("qemu missing from PATH: %+v", res)
	}
	abs := filepath.Join(dir, "nope")
	if _, res := QEMU(context.Background(), abs); res.OK || !strings.Contains(res.Detail, abs) ||
		!strings.Contains(res.Fix, "apt-get install qemu-system-x86") {
		t.Errorf("qemu path missing: %+v", res)
	}
}

func TestContainerdNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	v, res := Containerd(context.Background())
	if v != "" || !res.OK || res.Detail != "not found" {
		t.Errorf("version %q result %+v", v, res)
	}
}

func TestContainerdVersion(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "containerd", []byte("#!/bin/sh\necho 'containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1'\n"), 0o755)
	t.Setenv("PATH", dir)
	if v, res := Containerd(context.Background()); v != "1.6.20~ds1" || !res.OK {
		t.Errorf("version %q result %+v", v, res)
	}
}

func TestFeatureState(t *testing.T) {
	old := sysModule
	sysModule = t.TempDir()
	t.Cleanup(func() { sysModule = old })
	if err := os.Mkdir(filepath.Join(sysModule, "act_mirred"), 0o755); err != nil {
		t.Fatal(err)
	}
	kconfig := map[string]string{"CONFIG_NET_SCH_INGRESS": "y", "CONFIG_NET_CLS_U32": "m"}
	for f, want := range map[kernelFeature]string{
		{"act_mirred", "CONFIG_NET_ACT_MIRRED"}:   "loaded",
		{"sch_ingress", "CONFIG_NET_SCH_INGRESS"}: "built in",
		{"cls_u32", "CONFIG_NET_CLS_U32"}:         "module",
		{"macvtap", "CONFIG_MACVTAP"}:             "missing",
	} {
		if got := featureState(f, kconfig); got != want {
			t.Errorf("%s: %q, want %q", f.module, got, want)
		}
	}
	if got := featureState(kernelFeature{"macvtap", "CONFIG_MACVTAP"}, nil); !strings.HasPrefix(got, "unknown") {
		t.Errorf("no kernel config: %q", got)
	}
}

func TestCheckRequirements(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "qemu-system-x86_64", []byte("#!/bin/sh\necho 'QEMU emulator version 7.2.0'\n"), 0o755)
	t.Setenv("PATH", dir)
	c := config.Defaults()
	c.Hypervisor.Kernel = write(t, dir, "vmlinuz", fakeBzImage("6.1.0-test (x) #1"), 0o644)
	c.Hypervisor.Initrd = write(t, dir, "initrd", []byte("\x28\xb5\x2f\xfd"), 0o644)
	r := Check(context.Background(), &c)
	byName := map[string]Result{}
	for _, res := range r.Results {
		byName[res.Name] = res
	}
	for _, name := range []string{"qemu", "kernel", "initrd", "tap"} {
		if res, ok := byName[name]; !ok || !res.Required {
			t.Errorf("%s: missing or not required: %+v", name, res)
		}
	}
	for _, name := range []string{"kvm", "vhost-vsock", "landlock", "templates", "cgroup", "containerd", "macvtap"} {
		if res, ok := byName[name]; !ok || res.Required {
			t.Errorf("%s: missing or required: %+v", name, res)
		}
	}
	if !byName["tc"].Required {
		t.Errorf("tc not required under tcfilter")
	}
	for _, res := range []Result{byName["qemu"], byName["kernel"], byName["initrd"]} {
		if !res.OK {
			t.Errorf("%s failed: %+v", res.Name, res)
		}
	}
	if r.Kernel.Version != "6.1.0-test" || r.Initrd.Compression != "zstd" || r.QEMU.Version != "7.2.0" {
		t.Errorf("report %+v", r)
	}
	if (r.Accel == "kvm") != r.KVM {
		t.Errorf("accel %q with kvm %v", r.Accel, r.KVM)
	}
}

// The landlock row says what the kernel offers QEMU's confinement, and
// how to get it where it is missing.
func TestLandlock(t *testing.T) {
	res, abi := Landlock(), fsguard.LandlockABI()
	if res.OK != (abi >= fsguard.MinLandlockABI) || !strings.Contains(res.Detail, fmt.Sprintf("ABI %d", abi)) {
		t.Errorf("kernel ABI %d: %+v", abi, res)
	}
	if !res.OK && res.Fix == "" {
		t.Errorf("no fix given: %+v", res)
	}
}

// The templates row: on where the configuration and the kernel allow,
// off by configuration said as such.
func TestTemplates(t *testing.T) {
	res, kernelErr := Templates(true), fsguard.ReadOnlyOpens()
	if res.OK != (kernelErr == nil) || (kernelErr == nil) != strings.HasPrefix(res.Detail, "on:") {
		t.Errorf("templates on, kernel %v: %+v", kernelErr, res)
	}
	if !res.OK && res.Fix == "" {
		t.Errorf("no fix given: %+v", res)
	}
	if res := Templates(false); !res.OK || !strings.HasPrefix(res.Detail, "off") {
		t.Errorf("templates off: %+v", res)
	}
}
