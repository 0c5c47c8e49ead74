package hostcheck

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hull-runtime/hull/internal/guestimage/bzimage"
)

// KernelInfo is the guest kernel found.
type KernelInfo struct {
	Path    string `json:"path"`
	Format  string `json:"format,omitempty"`  // "bzImage" or "ELF vmlinux"
	Version string `json:"version,omitempty"` // the release, e.g. "6.1.0-18-cloud-amd64"
	Banner  string `json:"banner,omitempty"`  // the version string after "Linux version "
	Size    int64  `json:"size,omitempty"`
}

// InitrdInfo is the guest initramfs found.
type InitrdInfo struct {
	Path        string `json:"path"`
	Size        int64  `json:"size,omitempty"`
	Compression string `json:"compression,omitempty"` // "gzip", "zstd", ..., "none (cpio)"
}

const guestFix = "build and install the guest kernel and initramfs: make guest (or hull guest build)"

// Kernel checks that the guest kernel at path is a readable bzImage or
// vmlinux ELF and reads its version string.
func Kernel(path string) (KernelInfo, Result) {
	info := KernelInfo{Path: path}
	res := Result{Name: "kernel"}
	fail := func(format string, a ...any) (KernelInfo, Result) {
		res.Detail = fmt.Sprintf(format, a...)
		res.Fix = guestFix + ", or set hypervisor.qemu.kernel to an existing kernel"
		return info, res
	}
	if err := readableFile(path); err != nil {
		return fail("%v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return fail("%v", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		info.Size = fi.Size()
	}
	head := make([]byte, 64<<10)
	n, err := io.ReadFull(f, head)
	if err != nil && err != io.ErrUnexpectedEOF {
		return fail("reading %s: %v", path, err)
	}
	head = head[:n]
	version, isBzImage := bzimage.KernelVersion(head)
	switch {
	case bzimage.DetectFormat(head) == bzimage.FormatELF:
		info.Format = "ELF vmlinux"
		info.Banner = elfBanner(f)
	case isBzImage:
		info.Format = "bzImage"
		info.Banner = version
	default:
		return fail("%s is neither a bzImage nor an ELF vmlinux", path)
	}
	info.Banner = strings.TrimPrefix(info.Banner, "Linux version ")
	info.Version, _, _ = strings.Cut(info.Banner, " ")
	res.OK = true
	res.Detail = fmt.Sprintf("%s: %s, %s", path, info.Format, orUnknown(info.Banner))
	return info, res
}

// elfBanner finds "Linux version ..." in a vmlinux: in .rodata when the
// ELF has one, else anywhere in the file.
func elfBanner(f *os.File) string {
	var r io.Reader
	if ef, err := elf.NewFile(f); err == nil {
		if s := ef.Section(".rodata"); s != nil && s.Type != elf.SHT_NOBITS {
			r = s.Open()
		}
	}
	if r == nil {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return ""
		}
		r = f
	}
	return findBanner(r)
}

// findBanner returns the first "Linux version " string in r, up to its
// NUL or newline, reading r in chunks.
func findBanner(r io.Reader) string {
	needle := []byte("Linux version ")
	const keep, maxLen = 64, 256
	chunk := make([]byte, 1<<20)
	var buf []byte
	for {
		n, err := io.ReadFull(r, chunk)
		buf = append(buf, chunk[:n]...)
		if i := bytes.Index(buf, needle); i >= 0 {
			rest := buf[i:]
			if end := bytes.IndexAny(rest, "\x00\n"); end >= 0 && end <= maxLen {
				return string(rest[:end])
			}
			if len(rest) >= maxLen || err != nil {
				return string(rest[:min(len(rest), maxLen)])
			}
			buf = append(buf[:0], rest...)
			continue
		}
		if err != nil {
			return ""
		}
		if len(buf) > keep {
			buf = append(buf[:0], buf[len(buf)-keep:]...)
		}
	}
}

// Initrd checks that the initramfs at path is readable and names its
// compression from its first bytes.
func Initrd(path string) (InitrdInfo, Result) {
	info := InitrdInfo{Path: path}
	res := Result{Name: "initrd"}
	fail := func(format string, a ...any) (InitrdInfo, Result) {
		res.Detail = fmt.Sprintf(format, a...)
		res.Fix = guestFix + ", or set hypervisor.qemu.initrd to an existing initramfs"
		return info, res
	}
	if err := readableFile(path); err != nil {
		return fail("%v", err)
	}
	f, err := os.Open(path)
	if err != nil {
		return fail("%v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fail("%v", err)
	}
	info.Size = fi.Size()
	if info.Size == 0 {
		return fail("%s is empty", path)
	}
	magic := make([]byte, 6)
	n, _ := io.ReadFull(f, magic)
	info.Compression = compression(magic[:n])
	res.OK = true
	res.Detail = fmt.Sprintf("%s: %d bytes, %s", path, info.Size, info.Compression)
	return info, res
}

// compression names the initramfs format whose magic number starts p:
// an uncompressed newc archive, or one of the compressions the guest image
// package knows (the kernel's lz4 is the legacy frame).
func compression(p []byte) string {
	if bytes.HasPrefix(p, []byte("07070")) {
		return "none (cpio)"
	}
	switch f := bzimage.DetectFormat(p); f {
	case bzimage.FormatUnknown, bzimage.FormatELF:
		return "unknown format"
	case bzimage.FormatLZ4:
		return "lz4 (legacy)"
	default:
		return string(f)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "version unknown"
	}
	return s
}
