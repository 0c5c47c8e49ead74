package bzimage

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/guestimage/internal/testkit"
	"github.com/ulikunitz/xz"

	"github.com/hull-runtime/hull/internal/testenv"
)

func xzBytes(t *testing.T, data []byte, check byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := xz.WriterConfig{CheckSum: check}.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// withSize appends the uncompressed size as the kernel build does.
func withSize(p []byte, n int) []byte {
	return binary.LittleEndian.AppendUint32(bytes.Clone(p), uint32(n))
}

func TestVmlinuxXZ(t *testing.T) {
	elf := testkit.Vmlinux(true, 0x1000a50, 5000)
	for _, c := range []struct {
		name  string
		check byte
		sects uint8
	}{{"crc32", xz.CRC32, 27}, {"crc64", xz.CRC64, 0}, {"sha256", xz.SHA256, 4}, {"none", xz.None, 39}} {
		t.Run(c.name, func(t *testing.T) {
			img := testkit.BzImage(c.sects, 0x2cc, withSize(xzBytes(t, elf, c.check), len(elf)))
			h, err := ParseHeader(img)
			if err != nil {
				t.Fatal(err)
			}
			wantSects := int(c.sects)
			if wantSects == 0 {
				wantSects = 4
			}
			if h.SetupSects != wantSects || h.ProtectedOffset != (wantSects+1)*512 || h.PayloadOffset != 0x2cc {
				t.Errorf("header = %+v", h)
			}
			got, f, err := Vmlinux(img)
			if err != nil {
				t.Fatal(err)
			}
			if f != FormatXZ || !bytes.Equal(got, elf) {
				t.Fatalf("format %s, %d bytes, equal=%v", f, len(got), bytes.Equal(got, elf))
			}
			entry, ok, err := PVHEntry(got)
			if err != nil || !ok || entry != 0x1000a50 {
				t.Errorf("PVHEntry = %#x, %v, %v", entry, ok, err)
			}
		})
	}
}

// TestVmlinuxXZWithBCJ uses xz(1) to produce the filter chain the kernel
// build uses (--x86 --lzma2), which exercises the BCJ decoder.
func TestVmlinuxXZWithBCJ(t *testing.T) {
	testenv.Require(t, testenv.Bins("xz"))
	xzBin, _ := exec.LookPath("xz")
	// Code-like data: E8/E9 opcodes followed by small and negative offsets,
	// adjacent opcodes, and opcodes near the end.
	var elf []byte
	elf = append(elf, testkit.Vmlinux(false, 0, 3000)...)
	for i := range 20000 {
		elf = append(elf, 0xe8, byte(i), byte(i>>8), 0, 0, 0xe9, 0xe8, byte(i), 0xff, 0xff, 0xe8)
	}
	elf = append(elf, 0xe8, 1, 2, 0)
	cmd := exec.Command(xzBin, "--format=xz", "--check=crc32", "--x86", "--lzma2=dict=1MiB", "-c")
	cmd.Stdin = bytes.NewReader(elf)
	comp, err := cmd.Output()
	if err != nil {
		t.Fatalf("xz: %v", err)
	}
	out, err := decodeXZ(withSize(comp, len(elf)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, elf) {
		for i := range out {
			if out[i] != elf[i] {
				t.Fatalf("BCJ decode differs first at byte %d", i)
			}
		}
		t.Fatalf("length %d, want %d", len(out), len(elf))
	}
}

func TestVmlinuxGzipNoPVH(t *testing.T) {
	elf := testkit.Vmlinux(false, 0, 100)
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(elf)
	zw.Close()
	got, f, err := Vmlinux(testkit.BzImage(30, 0x300, withSize(buf.Bytes(), len(elf))))
	if err != nil || f != FormatGzip || !bytes.Equal(got, elf) {
		t.Fatalf("gzip: format %s, err %v, equal %v", f, err, bytes.Equal(got, elf))
	}
	if _, ok, err := PVHEntry(got); ok || err != nil {
		t.Errorf("PVHEntry on a kernel without the note: ok=%v err=%v", ok, err)
	}
}

func TestErrors(t *testing.T) {
	elf := testkit.Vmlinux(true, 1, 10)
	good := testkit.BzImage(4, 0x100, withSize(xzBytes(t, elf, xz.CRC32), len(elf)))

	bad := bytes.Clone(good)
	copy(bad[0x202:], "HdrX")
	if _, _, err := Vmlinux(bad); !errors.Is(err, ErrNotBzImage) || !strings.Contains(err.Error(), "magic") {
		t.Errorf("bad magic: %v", err)
	}
	if _, _, err := Vmlinux(good[:0x240]); !errors.Is(err, ErrNotBzImage) {
		t.Errorf("short file: %v", err)
	}
	long := bytes.Clone(good)
	binary.LittleEndian.PutUint32(long[0x24c:], uint32(len(good)))
	if _, _, err := Vmlinux(long); !errors.Is(err, ErrNotBzImage) || !strings.Contains(err.Error(), "outside") {
		t.Errorf("payload past the end: %v", err)
	}
	zstd := testkit.BzImage(4, 0, []byte{0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3, 4})
	if _, f, err := Vmlinux(zstd); !errors.Is(err, ErrUnsupportedFormat) || f != FormatZstd || !strings.Contains(err.Error(), "zstd") {
		t.Errorf("zstd payload: %s %v", f, err)
	}
	// Flip a byte inside the compressed data: the check (or LZMA2) must catch it.
	corrupt := bytes.Clone(good)
	h, _ := ParseHeader(corrupt)
	corrupt[h.ProtectedOffset+int(h.PayloadOffset)+40] ^= 0x55
	if _, _, err := Vmlinux(corrupt); err == nil {
		t.Error("corrupt payload accepted")
	}
	// Wrong appended size.
	wrong := testkit.BzImage(4, 0x100, withSize(xzBytes(t, elf, xz.CRC32), len(elf)+1))
	if _, _, err := Vmlinux(wrong); err == nil || !strings.Contains(err.Error(), "appended size") {
		t.Errorf("wrong appended size: %v", err)
	}
	// A payload that decompresses to something other than an ELF.
	notELF := testkit.BzImage(4, 0, xzBytes(t, []byte("hello, not an elf"), xz.CRC32))
	if _, _, err := Vmlinux(notELF); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("non-ELF payload: %v", err)
	}
}

func TestPVHEntryBadInput(t *testing.T) {
	if _, _, err := PVHEntry([]byte("nope")); err == nil {
		t.Error("non-ELF accepted")
	}
}

func TestKernelVersion(t *testing.T) {
	img := make([]byte, 0x400)
	copy(img[0x202:], "HdrS")
	img[0x20e] = 0x10 // the string at 0x200+0x10
	copy(img[0x210:], "6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1\x00junk")
	if v, ok := KernelVersion(img); !ok || v != "6.1.0-57-amd64 (debian-kernel@lists.debian.org) #1" {
		t.Errorf("KernelVersion = %q, %v", v, ok)
	}
	if _, ok := KernelVersion(make([]byte, 0x400)); ok {
		t.Error("an image without HdrS has a setup header")
	}
}
