package guestimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/guestimage/cpio"
	"github.com/hull-runtime/hull/internal/guestimage/internal/testkit"
	"github.com/hull-runtime/hull/internal/guestimage/kmod"
	"github.com/ulikunitz/xz"

	"github.com/hull-runtime/hull/internal/testenv"
)

const testRelease = "6.1.0-test-amd64"

// testModules is a small module tree with the real names and dependency
// shape of Debian 6.1's virtio modules, plus modules nobody wants.
var testModules = map[string][]string{
	"drivers/virtio/virtio":                           nil,
	"drivers/virtio/virtio_ring":                      nil,
	"drivers/virtio/virtio_pci_modern_dev":            nil,
	"drivers/virtio/virtio_pci_legacy_dev":            nil,
	"drivers/virtio/virtio_pci":                       {"virtio_ring", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio"},
	"drivers/char/virtio_console":                     {"virtio", "virtio_ring"},
	"drivers/block/virtio_blk":                        {"virtio", "virtio_ring"},
	"drivers/scsi/scsi_common":                        nil,
	"drivers/scsi/scsi_mod":                           {"scsi_common"},
	"block/t10-pi":                                    {"crc64-rocksoft"},
	"lib/crc64-rocksoft":                              nil,
	"drivers/scsi/sd_mod":                             {"scsi_mod", "t10-pi", "scsi_common"},
	"drivers/scsi/virtio_scsi":                        {"scsi_mod", "virtio", "virtio_ring"},
	"drivers/net/net_failover":                        {"failover"},
	"net/core/failover":                               nil,
	"drivers/net/virtio_net":                          {"net_failover", "virtio", "virtio_ring"},
	"net/9p/9pnet":                                    nil,
	"net/9p/9pnet_virtio":                             {"9pnet", "virtio", "virtio_ring"},
	"fs/netfs/netfs":                                  nil,
	"fs/fscache/fscache":                              {"netfs"},
	"fs/9p/9p":                                        {"9pnet", "fscache", "netfs"},
	"fs/fuse/fuse":                                    nil,
	"fs/fuse/virtiofs":                                {"fuse", "virtio", "virtio_ring"},
	"fs/overlayfs/overlay":                            nil,
	"net/vmw_vsock/vsock":                             nil,
	"net/vmw_vsock/vmw_vsock_virtio_transport_common": {"vsock"},
	"net/vmw_vsock/vmw_vsock_virtio_transport":        {"vmw_vsock_virtio_transport_common", "vsock", "virtio", "virtio_ring"},
	"drivers/char/hw_random/virtio-rng":               {"virtio", "virtio_ring"},
	"drivers/virtio/virtio_balloon":                   {"virtio", "virtio_ring"},
	"drivers/gpu/drm/i915/i915":                       {"drm"},
	"drivers/gpu/drm/drm":                             nil,
}

type member struct {
	name string
	data []byte
}

// packageTree returns the members of a synthetic kernel package, in the
// order dpkg-deb lists Debian's (boot first).
func packageTree(t *testing.T, skip ...string) []member {
	t.Helper()
	elfImage := testkit.Vmlinux(true, 0x1000a50, 2000)
	var comp bytes.Buffer
	w, err := xz.WriterConfig{CheckSum: xz.CRC32}.NewWriter(&comp)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(elfImage)
	w.Close()
	payload := binary.LittleEndian.AppendUint32(comp.Bytes(), uint32(len(elfImage)))
	ms := []member{
		{"boot/System.map-" + testRelease, []byte("ffffffff81000000 T _text\n")},
		{"boot/config-" + testRelease, []byte("CONFIG_VIRTIO=m\n")},
		{"boot/vmlinuz-" + testRelease, testkit.BzImage(27, 0x2cc, payload)},
		{"lib/modules/" + testRelease + "/modules.order", []byte("kernel/fs/9p/9p.ko\n")},
	}
	paths := make([]string, 0, len(testModules))
	for p := range testModules {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		name := filepath.Base(p)
		if slices.Contains(skip, name) {
			continue
		}
		ms = append(ms, member{"lib/modules/" + testRelease + "/kernel/" + p + ".ko",
			testkit.Module(name, testModules[p], testRelease+" SMP preempt mod_unload modversions")})
	}
	return ms
}

func tarBytes(t *testing.T, ms []member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, m := range ms {
		for d := filepath.Dir(m.name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	for _, d := range ds {
		tw.WriteHeader(&tar.Header{Name: "./" + d + "/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for _, m := range ms {
		if err := tw.WriteHeader(&tar.Header{Name: "./" + m.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(m.data))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(m.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func memTar(b []byte) tarSource {
	return func(context.Context) (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// fakeAgent writes a static-looking x86-64 ELF executable.
func fakeAgent(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "hull-agent")
	if err := os.WriteFile(p, testkit.ELF(2, testkit.Section{Name: ".text", Type: 1, Data: []byte("agent code")}), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readInitrd(t *testing.T, p string) map[string]cpio.Record {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	recs, err := cpio.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cpio.Record{}
	for _, r := range recs {
		out["/"+r.Name] = r
	}
	return out
}

func TestBuildSynthetic(t *testing.T) {
	tmp := t.TempDir()
	agent := fakeAgent(t, tmp)
	src := memTar(tarBytes(t, packageTree(t)))
	var log bytes.Buffer
	res, err := build(context.Background(), Options{AgentBinary: agent, OutDir: filepath.Join(tmp, "a"), Modules: DefaultModules, Log: &log}, src)
	if err != nil {
		t.Fatal(err)
	}
	if res.KernelRelease != testRelease || !res.PVH || res.PVHEntry != 0x1000a50 {
		t.Errorf("release %q pvh %v entry %#x", res.KernelRelease, res.PVH, res.PVHEntry)
	}
	for _, s := range []string{"vmlinux", "hull-initrd.img", "PVH entry note", testRelease} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("log does not mention %q:\n%s", s, log.String())
		}
	}
	for _, a := range []Artifact{res.Vmlinux, res.Vmlinuz, res.Initrd} {
		fi, err := os.Stat(a.Path)
		if err != nil || fi.Size() != a.Size {
			t.Errorf("%s: %v, size %d vs %d", a.Path, err, fi.Size(), a.Size)
		}
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "a", ".*tmp*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	files := readInitrd(t, res.Initrd.Path)
	initRec := files["/init"]
	want, _ := os.ReadFile(agent)
	if !bytes.Equal(initRec.Data, want) || initRec.Mode != cpio.TypeReg|0o755 {
		t.Errorf("/init mode %o, %d bytes", initRec.Mode, len(initRec.Data))
	}
	for p, dev := range map[string][2]uint32{"/dev/console": {5, 1}, "/dev/null": {1, 3}} {
		r := files[p]
		if r.Mode&cpio.TypeMask != cpio.TypeChar || r.RdevMaj != dev[0] || r.RdevMin != dev[1] {
			t.Errorf("%s: mode %o rdev %d,%d", p, r.Mode, r.RdevMaj, r.RdevMin)
		}
	}
	for _, d := range []string{"/dev", "/proc", "/sys", "/run", "/tmp", "/etc", "/lib/modules"} {
		if files[d].Mode != cpio.TypeDir|0o755 {
			t.Errorf("%s: mode %o, want directory 0755", d, files[d].Mode)
		}
	}

	list := strings.Split(strings.TrimSuffix(string(files[ModulesListPath].Data), "\n"), "\n")
	if !slices.Equal(list, res.Modules) {
		t.Errorf("%s = %q, Result.Modules = %q", ModulesListPath, list, res.Modules)
	}
	// Exactly the closure: no i915/drm, every wanted root, deps before users.
	pos := map[string]int{}
	for i, p := range list {
		name, _ := kmod.NameFromPath(p)
		pos[name] = i
		if _, ok := files[p]; !ok {
			t.Errorf("%s listed but not in the archive", p)
		}
		if !strings.HasPrefix(p, "/lib/modules/"+testRelease+"/kernel/") {
			t.Errorf("module path %s outside the release tree", p)
		}
	}
	if len(list) != len(testModules)-2 {
		t.Errorf("%d modules, want %d: %q", len(list), len(testModules)-2, list)
	}
	for _, root := range DefaultModules {
		if _, ok := pos[kmod.Normalize(root)]; !ok {
			t.Errorf("wanted module %s missing", root)
		}
	}
	for p, deps := range testModules {
		name := kmod.Normalize(filepath.Base(p))
		for _, d := range deps {
			if i, ok := pos[name]; ok && pos[kmod.Normalize(d)] > i {
				t.Errorf("%s loads before its dependency %s", name, d)
			}
		}
	}
	if _, ok := pos["i915"]; ok {
		t.Error("unwanted module i915 included")
	}
	info := string(files[ImageInfoPath].Data)
	if !strings.Contains(info, "kernel-release="+testRelease) {
		t.Errorf("image-info: %q", info)
	}

	// Same inputs, another directory: the same bytes.
	res2, err := build(context.Background(), Options{AgentBinary: agent, OutDir: filepath.Join(tmp, "b"), Modules: DefaultModules}, src)
	if err != nil {
		t.Fatal(err)
	}
	if res.Initrd.SHA256 != res2.Initrd.SHA256 || res.Vmlinux.SHA256 != res2.Vmlinux.SHA256 {
		t.Errorf("not reproducible: initrd %s vs %s, vmlinux %s vs %s", res.Initrd.SHA256, res2.Initrd.SHA256, res.Vmlinux.SHA256, res2.Vmlinux.SHA256)
	}
	b1, _ := os.ReadFile(res.Initrd.Path)
	b2, _ := os.ReadFile(res2.Initrd.Path)
	if !bytes.Equal(b1, b2) {
		t.Error("initrd files differ")
	}
	// Gzipped, too, the same inputs give the same bytes, and the gzip
	// header carries no name and no time.
	var gz [2][]byte
	for i, d := range []string{"c", "d"} {
		r, err := build(context.Background(), Options{AgentBinary: agent, OutDir: filepath.Join(tmp, d), Modules: DefaultModules, Compression: "gzip"}, src)
		if err != nil {
			t.Fatal(err)
		}
		gz[i], _ = os.ReadFile(r.Initrd.Path)
		if len(readInitrd(t, r.Initrd.Path)) != len(files) {
			t.Errorf("gzip initrd holds other files than the uncompressed one")
		}
	}
	if !bytes.Equal(gz[0], gz[1]) {
		t.Error("gzip initrd files differ")
	}
	if mt := binary.LittleEndian.Uint32(gz[0][4:8]); mt != 0 || gz[0][3] != 0 {
		t.Errorf("gzip header: flags %#x mtime %d", gz[0][3], mt)
	}
}

func TestBuildMissingModule(t *testing.T) {
	tmp := t.TempDir()
	agent := fakeAgent(t, tmp)
	out := filepath.Join(tmp, "out")
	for _, c := range []struct{ skip, want string }{
		{"virtiofs", "module virtiofs"},
		{"fscache", "module fscache (needed by 9p)"},
	} {
		src := memTar(tarBytes(t, packageTree(t, c.skip)))
		_, err := build(context.Background(), Options{AgentBinary: agent, OutDir: out, Modules: DefaultModules}, src)
		if !errors.Is(err, kmod.ErrNotFound) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("without %s: err = %v, want one containing %q", c.skip, err, c.want)
		}
	}
	if ents, _ := os.ReadDir(out); len(ents) != 0 {
		t.Errorf("failed builds left %d files in %s", len(ents), out)
	}
}

func TestBuildBadInputs(t *testing.T) {
	tmp := t.TempDir()
	agent := fakeAgent(t, tmp)
	tree := packageTree(t)
	noKernel := memTar(tarBytes(t, tree[3:]))
	if _, err := build(context.Background(), Options{AgentBinary: agent, OutDir: tmp, Modules: DefaultModules}, noKernel); err == nil || !strings.Contains(err.Error(), "vmlinuz") {
		t.Errorf("package without kernel: %v", err)
	}
	badImage := slices.Clone(tree)
	badImage[2].data = bytes.Repeat([]byte{1}, 4096)
	if _, err := build(context.Background(), Options{AgentBinary: agent, OutDir: tmp, Modules: DefaultModules}, memTar(tarBytes(t, badImage))); err == nil || !strings.Contains(err.Error(), "HdrS") {
		t.Errorf("bad bzImage: %v", err)
	}
	script := filepath.Join(tmp, "agent.sh")
	os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755)
	if _, err := build(context.Background(), Options{AgentBinary: script, OutDir: tmp, Modules: DefaultModules}, memTar(tarBytes(t, tree))); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("script as agent: %v", err)
	}
	if _, err := Build(context.Background(), Options{AgentBinary: agent}); err == nil {
		t.Error("no OutDir accepted")
	}
}

func TestParseDepends(t *testing.T) {
	out := []byte("linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n")
	if got := parseDepends(out); got != "linux-image-6.1.0-57-amd64" {
		t.Errorf("parseDepends = %q", got)
	}
	out = []byte("linux-image-6.1.0-57-amd64\n  Depends: kmod\n |Depends: initramfs-tools\n  Depends: <linux-initramfs-tool>\n")
	if got := parseDepends(out); got != "" {
		t.Errorf("parseDepends of a real package = %q", got)
	}
	show := []byte("Package: linux-image-6.1.0-57-amd64\nVersion: 6.1.192-3\nFilename: pool/updates/main/l/linux-signed-amd64/linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb\n")
	if got := debFileName(show); got != "linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb" {
		t.Errorf("debFileName = %q", got)
	}
}

// fakeApt answers apt-cache and apt-get like Debian 12 does.
type fakeApt struct {
	updated bool
	calls   []string
}

func (f *fakeApt) run(_ context.Context, dir, name string, args ...string) ([]byte, error) {
	call := name + " " + strings.Join(args, " ")
	f.calls = append(f.calls, call)
	switch {
	case call == "apt-cache depends linux-image-amd64":
		if !f.updated {
			return []byte("linux-image-amd64\n"), nil
		}
		return []byte("linux-image-amd64\n  Depends: linux-image-6.1.0-57-amd64\n"), nil
	case call == "apt-get update":
		f.updated = true
		return nil, nil
	case call == "apt-cache show --no-all-versions linux-image-6.1.0-57-amd64":
		return []byte("Filename: pool/main/l/linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb\n"), nil
	case call == "apt-get download linux-image-6.1.0-57-amd64":
		return nil, os.WriteFile(filepath.Join(dir, "linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb"), []byte("deb"), 0o644)
	}
	return nil, errors.New("unexpected command " + call)
}

func TestFetcher(t *testing.T) {
	work := t.TempDir()
	apt := &fakeApt{}
	f := &fetcher{run: apt.run, log: io.Discard}
	pkg, err := f.resolve(context.Background(), "linux-image-amd64")
	if err != nil || pkg != "linux-image-6.1.0-57-amd64" || !apt.updated {
		t.Fatalf("resolve = %q, %v (updated %v)", pkg, err, apt.updated)
	}
	deb, err := f.fetch(context.Background(), pkg, work)
	if err != nil || filepath.Base(deb) != "linux-image-6.1.0-57-amd64_6.1.192-3_amd64.deb" {
		t.Fatalf("fetch = %q, %v", deb, err)
	}
	n := len(apt.calls)
	if _, err := f.fetch(context.Background(), pkg, work); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(apt.calls[n:], "apt-get download linux-image-6.1.0-57-amd64") {
		t.Error("cached package downloaded again")
	}
	if ents, _ := os.ReadDir(work); len(ents) != 1 {
		t.Errorf("work dir holds %d entries, want only the .deb", len(ents))
	}
	if _, err := f.resolve(context.Background(), "linux-image-nonexistent"); err == nil {
		t.Error("unknown package resolved")
	}
}

// TestBuildFromDeb goes through dpkg-deb with a package made by dpkg-deb.
func TestBuildFromDeb(t *testing.T) {
	testenv.Require(t, testenv.Bins("dpkg-deb"))
	tmp := t.TempDir()
	root := filepath.Join(tmp, "pkg")
	for _, m := range packageTree(t) {
		p := filepath.Join(root, m.name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, m.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755)
	control := "Package: linux-image-test\nVersion: 1\nArchitecture: amd64\nMaintainer: test <t@example.org>\nDescription: test\n"
	os.WriteFile(filepath.Join(root, "DEBIAN/control"), []byte(control), 0o644)
	deb := filepath.Join(tmp, "k.deb")
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "-Zxz", "-b", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -b: %v: %s", err, out)
	}
	res, err := Build(context.Background(), Options{AgentBinary: fakeAgent(t, tmp), OutDir: filepath.Join(tmp, "out"), KernelDeb: deb})
	if err != nil {
		t.Fatal(err)
	}
	if res.KernelRelease != testRelease || len(res.Modules) != len(testModules)-2 || !res.PVH {
		t.Errorf("result: %+v", res)
	}
	if _, err := Build(context.Background(), Options{AgentBinary: fakeAgent(t, tmp), OutDir: filepath.Join(tmp, "out"), KernelDeb: filepath.Join(tmp, "missing.deb")}); err == nil || !strings.Contains(err.Error(), "missing.deb") {
		t.Errorf("missing .deb: %v", err)
	}
	if _, err := Build(context.Background(), Options{AgentBinary: fakeAgent(t, tmp), OutDir: filepath.Join(tmp, "out"), KernelDeb: fakeAgent(t, tmp)}); err == nil || !strings.Contains(err.Error(), "dpkg-deb") {
		t.Errorf("not a .deb: %v", err)
	}
}
