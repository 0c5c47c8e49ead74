package guestimage

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/guest/container"
	"github.com/hull-runtime/hull/internal/guestimage/internal/testkit"
)

// builtKernel writes a kernel directory as hack/build-kernel.sh leaves it:
// vmlinux with a PVH note, and a bzImage whose setup header names release.
func builtKernel(t *testing.T, dir, release string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bz := testkit.BzImage(4, 0, []byte("payload"))
	// The version string sits in the setup code; its offset from 0x200
	// goes in the header at 0x20e.
	bz = append(bz, []byte(release+" (hull@hull) #1 SMP\x00")...)
	binary.LittleEndian.PutUint16(bz[0x20e:], uint16(len(bz)-len(release)-20-0x200))
	if err := os.WriteFile(filepath.Join(dir, VmlinuxName), testkit.Vmlinux(true, 0x1000a50, 100), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, VmlinuzName), bz, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestBuildFromKernelDir(t *testing.T) {
	tmp := t.TempDir()
	agent := fakeAgent(t, tmp)
	kdir := filepath.Join(tmp, "kernel")
	builtKernel(t, kdir, "6.1.192-hull")
	var log bytes.Buffer
	res, err := Build(context.Background(), Options{AgentBinary: agent, KernelDir: kdir, OutDir: filepath.Join(tmp, "a"), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if res.KernelRelease != "6.1.192-hull" || !res.PVH || res.PVHEntry != 0x1000a50 || len(res.Modules) != 0 {
		t.Errorf("release %q pvh %v entry %#x modules %q", res.KernelRelease, res.PVH, res.PVHEntry, res.Modules)
	}
	want, _ := os.ReadFile(filepath.Join(kdir, VmlinuxName))
	got, _ := os.ReadFile(res.Vmlinux.Path)
	if !bytes.Equal(got, want) {
		t.Error("vmlinux is not the built kernel's")
	}
	files := readInitrd(t, res.Initrd.Path)
	if _, ok := files[ModulesListPath]; ok {
		t.Errorf("%s present for a kernel without modules", ModulesListPath)
	}
	for p := range files {
		if strings.HasPrefix(p, "/lib/modules") {
			t.Errorf("module tree entry %s in the initramfs", p)
		}
	}
	if !strings.Contains(string(files[ImageInfoPath].Data), "kernel-release=6.1.192-hull\nmodules=\n") {
		t.Errorf("image-info: %q", files[ImageInfoPath].Data)
	}
	if !strings.Contains(log.String(), "0 modules") {
		t.Errorf("log: %s", log.String())
	}
	// Same inputs, the same bytes.
	res2, err := Build(context.Background(), Options{AgentBinary: agent, KernelDir: kdir, OutDir: filepath.Join(tmp, "b")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Initrd.SHA256 != res2.Initrd.SHA256 || res.Vmlinux.SHA256 != res2.Vmlinux.SHA256 {
		t.Error("not reproducible")
	}
}

func TestBuildFromKernelDirBad(t *testing.T) {
	tmp := t.TempDir()
	agent := fakeAgent(t, tmp)
	good := filepath.Join(tmp, "good")
	builtKernel(t, good, "6.1.192-hull")
	noBz := filepath.Join(tmp, "nobz")
	builtKernel(t, noBz, "x")
	os.WriteFile(filepath.Join(noBz, VmlinuzName), []byte("not a bzImage, long enough to hold a header........................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................."), 0o644)
	notELF := filepath.Join(tmp, "notelf")
	builtKernel(t, notELF, "x")
	os.WriteFile(filepath.Join(notELF, VmlinuxName), []byte("text"), 0o644)
	for _, c := range []struct {
		name string
		opts Options
		want string
	}{
		{"missing dir", Options{KernelDir: filepath.Join(tmp, "none")}, "reading the built kernel: open " + filepath.Join(tmp, "none", "vmlinux")},
		{"not elf", Options{KernelDir: notELF}, notELF + "/vmlinux is not an ELF kernel"},
		{"not bzimage", Options{KernelDir: noBz}, noBz + "/vmlinuz is not a bzImage"},
		{"dir and deb", Options{KernelDir: good, KernelDeb: "/x.deb"}, "a built kernel (" + good + ") and a kernel package (/x.deb) given"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := filepath.Join(tmp, "out-"+strings.ReplaceAll(c.name, " ", "-"))
			c.opts.AgentBinary, c.opts.OutDir = agent, out
			_, err := Build(context.Background(), c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			if ents, _ := os.ReadDir(out); len(ents) != 0 {
				t.Errorf("bad input left %d files in %s", len(ents), out)
			}
		})
	}
}

// The pause goes in a directory of its own, where the agent looks for it;
// an image built without one has neither, and a pause that needs a libc
// is refused by name.
func TestBuildWithPause(t *testing.T) {
	if PauseDir != container.DefaultPauseDir {
		t.Fatalf("the image puts the pause in %s, the agent looks in %s", PauseDir, container.DefaultPauseDir)
	}
	tmp := t.TempDir()
	agent := fakeAgent(t, tmp)
	pause := filepath.Join(tmp, "hull-pause")
	if err := os.WriteFile(pause, testkit.ELF(2, testkit.Section{Name: ".text", Type: 1, Data: []byte("pause code")}), 0o755); err != nil {
		t.Fatal(err)
	}
	kdir := filepath.Join(tmp, "kernel")
	builtKernel(t, kdir, "6.1.192-hull")
	res, err := Build(context.Background(), Options{AgentBinary: agent, PauseBinary: pause, KernelDir: kdir, OutDir: filepath.Join(tmp, "with")})
	if err != nil {
		t.Fatal(err)
	}
	files := readInitrd(t, res.Initrd.Path)
	want, _ := os.ReadFile(pause)
	got, ok := files[path.Join(PauseDir, PauseName)]
	if !ok || !bytes.Equal(got.Data, want) || got.Mode&0o777 != 0o755 {
		t.Fatalf("pause in the initramfs: present %v, %d bytes, mode %o", ok, len(got.Data), got.Mode)
	}
	var inDir []string
	for p := range files {
		if strings.HasPrefix(p, PauseDir+"/") {
			inDir = append(inDir, p)
		}
	}
	if len(inDir) != 1 {
		t.Errorf("the pause directory holds %q, want the pause only", inDir)
	}

	res, err = Build(context.Background(), Options{AgentBinary: agent, KernelDir: kdir, OutDir: filepath.Join(tmp, "without")})
	if err != nil {
		t.Fatal(err)
	}
	for p := range readInitrd(t, res.Initrd.Path) {
		if strings.HasPrefix(p, PauseDir) {
			t.Errorf("%s in an image built without a pause", p)
		}
	}

	dynamic, err := os.ReadFile("/bin/true") // Debian's, linked against libc
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(pause, dynamic, 0o755)
	out := filepath.Join(tmp, "dynamic")
	_, err = Build(context.Background(), Options{AgentBinary: agent, PauseBinary: pause, KernelDir: kdir, OutDir: out})
	if err == nil || !strings.Contains(err.Error(), "pause binary "+pause+" is dynamically linked") {
		t.Fatalf("dynamic pause: %v", err)
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("a refused pause left %d files in %s", len(ents), out)
	}
}

// TestBuildFromKernelDirDropsSymbols: a kernel directory of an operator's
// own build, whose vmlinux still has its symbol table, gets a vmlinux
// without one that still boots through PVH, and the log says so.
func TestBuildFromKernelDirDropsSymbols(t *testing.T) {
	tmp := t.TempDir()
	kdir := filepath.Join(tmp, "kernel")
	builtKernel(t, kdir, "6.1.192-custom")
	unstripped := testkit.LinkedVmlinux(0x1000a50, 1<<20)
	if err := os.WriteFile(filepath.Join(kdir, VmlinuxName), unstripped, 0o644); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	res, err := Build(context.Background(), Options{AgentBinary: fakeAgent(t, tmp), KernelDir: kdir, OutDir: filepath.Join(tmp, "out"), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if !res.PVH || res.PVHEntry != 0x1000a50 {
		t.Errorf("pvh %v entry %#x, want the note's 0x1000a50", res.PVH, res.PVHEntry)
	}
	f, err := elf.Open(res.Vmlinux.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.SectionByType(elf.SHT_SYMTAB) != nil || res.Vmlinux.Size > int64(len(unstripped))-1<<20 {
		t.Errorf("vmlinux keeps its symbol table: %d bytes of %d", res.Vmlinux.Size, len(unstripped))
	}
	if !strings.Contains(log.String(), filepath.Join(kdir, VmlinuxName)+": its symbol table") {
		t.Errorf("log does not say the symbols were dropped: %s", log.String())
	}
}
