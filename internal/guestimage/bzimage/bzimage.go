// Package bzimage takes apart an x86 Linux boot image (bzImage): it reads
// the setup header, finds the compressed kernel payload, decompresses it to
// the uncompressed vmlinux ELF and looks for the PVH entry note QEMU needs to
// boot that ELF directly.
package bzimage

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Offsets into the boot sector and setup header (Documentation/arch/x86/boot.rst).
const (
	offSetupSects    = 0x1f1
	offHeaderMagic   = 0x202
	offVersion       = 0x206
	offPayloadOffset = 0x248
	offPayloadLength = 0x24c
	headerMagic      = "HdrS"
	minVersion       = 0x0208 // the first protocol with payload_offset/length
	sectorSize       = 512
)

// ErrNotBzImage is wrapped by errors about a file that is not a usable bzImage.
var ErrNotBzImage = errors.New("not a bzImage")

// Header is the part of the setup header this package uses.
type Header struct {
	SetupSects      int    // real-mode setup sectors (0 in the file means 4)
	Version         uint16 // boot protocol version, e.g. 0x020f
	PayloadOffset   uint32 // relative to the protected-mode code
	PayloadLength   uint32
	ProtectedOffset int // file offset of the protected-mode code
}

// ParseHeader validates and reads the setup header of image.
func ParseHeader(image []byte) (Header, error) {
	if len(image) < offPayloadLength+4 {
		return Header{}, fmt.Errorf("%w: %d bytes is too short for a setup header", ErrNotBzImage, len(image))
	}
	if m := image[offHeaderMagic : offHeaderMagic+4]; string(m) != headerMagic {
		return Header{}, fmt.Errorf("%w: magic at 0x202 is %q, want %q", ErrNotBzImage, m, headerMagic)
	}
	le := binary.LittleEndian
	h := Header{
		SetupSects:    int(image[offSetupSects]),
		Version:       le.Uint16(image[offVersion:]),
		PayloadOffset: le.Uint32(image[offPayloadOffset:]),
		PayloadLength: le.Uint32(image[offPayloadLength:]),
	}
	if h.SetupSects == 0 {
		h.SetupSects = 4
	}
	if h.Version < minVersion {
		return h, fmt.Errorf("%w: boot protocol %d.%02d has no payload fields (need 2.08)", ErrNotBzImage, h.Version>>8, h.Version&0xff)
	}
	h.ProtectedOffset = (h.SetupSects + 1) * sectorSize
	end := uint64(h.ProtectedOffset) + uint64(h.PayloadOffset) + uint64(h.PayloadLength)
	if h.PayloadLength == 0 || end > uint64(len(image)) {
		return h, fmt.Errorf("%w: payload [%#x, +%d) lies outside the %d-byte file", ErrNotBzImage,
			h.ProtectedOffset+int(h.PayloadOffset), h.PayloadLength, len(image))
	}
	return h, nil
}

// Payload returns the compressed kernel inside image.
func Payload(image []byte) ([]byte, error) {
	h, err := ParseHeader(image)
	if err != nil {
		return nil, err
	}
	start := h.ProtectedOffset + int(h.PayloadOffset)
	return image[start : start+int(h.PayloadLength)], nil
}

// Format names a payload compression.
type Format string

// Payload formats the kernel can be built with.
const (
	FormatXZ      Format = "xz"
	FormatGzip    Format = "gzip"
	FormatZstd    Format = "zstd"
	FormatLZ4     Format = "lz4"
	FormatBzip2   Format = "bzip2"
	FormatLZMA    Format = "lzma"
	FormatLZO     Format = "lzo"
	FormatELF     Format = "uncompressed ELF"
	FormatUnknown Format = "unknown"
)

// DetectFormat identifies a payload by its magic bytes.
func DetectFormat(p []byte) Format {
	switch {
	case bytes.HasPrefix(p, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return FormatXZ
	case bytes.HasPrefix(p, []byte{0x1f, 0x8b}):
		return FormatGzip
	case bytes.HasPrefix(p, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return FormatZstd
	case bytes.HasPrefix(p, []byte{0x02, 0x21, 0x4c, 0x18}):
		return FormatLZ4
	case bytes.HasPrefix(p, []byte("BZh")):
		return FormatBzip2
	case bytes.HasPrefix(p, []byte{0x5d, 0, 0}):
		return FormatLZMA
	case bytes.HasPrefix(p, []byte{0x89, 'L', 'Z', 'O'}):
		return FormatLZO
	case bytes.HasPrefix(p, []byte(elf.ELFMAG)):
		return FormatELF
	}
	return FormatUnknown
}

// ErrUnsupportedFormat is wrapped when the payload's compression is not one
// this package decodes.
var ErrUnsupportedFormat = errors.New("unsupported payload compression")

// Vmlinux extracts the uncompressed kernel ELF from a bzImage and checks
// that it is an x86-64 ELF.
func Vmlinux(image []byte) ([]byte, Format, error) {
	p, err := Payload(image)
	if err != nil {
		return nil, FormatUnknown, err
	}
	f := DetectFormat(p)
	var out []byte
	switch f {
	case FormatXZ:
		out, err = decodeXZ(p)
	case FormatGzip:
		out, err = decodeGzip(p)
	case FormatELF:
		out = bytes.Clone(p)
	default:
		return nil, f, fmt.Errorf("decompressing kernel payload: %w: %s (magic % x)", ErrUnsupportedFormat, f, p[:min(len(p), 6)])
	}
	if err != nil {
		return nil, f, fmt.Errorf("decompressing %s kernel payload: %w", f, err)
	}
	ef, err := elf.NewFile(bytes.NewReader(out))
	if err != nil {
		return nil, f, fmt.Errorf("decompressed %s payload is not an ELF: %w", f, err)
	}
	defer ef.Close()
	if ef.Class != elf.ELFCLASS64 || ef.Machine != elf.EM_X86_64 {
		return nil, f, fmt.Errorf("decompressed kernel is %v %v, want ELFCLASS64 EM_X86_64", ef.Class, ef.Machine)
	}
	return out, f, nil
}

func decodeGzip(p []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(p))
	if err != nil {
		return nil, err
	}
	zr.Multistream(false) // the kernel build may append the size after the member
	return io.ReadAll(zr)
}

// XenElfnotePhys32Entry is the ELF note type (owner "Xen") holding the 32-bit
// PVH entry point; QEMU boots an ELF kernel through PVH only if it is present.
const XenElfnotePhys32Entry = 18

// PVHEntry reports the PVH entry point of a vmlinux ELF, with ok false if
// the kernel has no XEN_ELFNOTE_PHYS32_ENTRY note.
func PVHEntry(vmlinux []byte) (entry uint32, ok bool, err error) {
	ef, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return 0, false, fmt.Errorf("reading vmlinux ELF: %w", err)
	}
	defer ef.Close()
	var blobs [][]byte
	for _, s := range ef.Sections {
		if s.Type == elf.SHT_NOTE {
			d, err := s.Data()
			if err != nil {
				return 0, false, fmt.Errorf("reading note section %s: %w", s.Name, err)
			}
			blobs = append(blobs, d)
		}
	}
	if len(blobs) == 0 {
		for _, p := range ef.Progs {
			if p.Type == elf.PT_NOTE {
				d, err := io.ReadAll(p.Open())
				if err != nil {
					return 0, false, fmt.Errorf("reading PT_NOTE segment: %w", err)
				}
				blobs = append(blobs, d)
			}
		}
	}
	for _, b := range blobs {
		for n, err := range notes(b, ef.ByteOrder) {
			if err != nil {
				return 0, false, err
			}
			if n.name == "Xen" && n.typ == XenElfnotePhys32Entry && len(n.desc) >= 4 {
				return ef.ByteOrder.Uint32(n.desc), true, nil
			}
		}
	}
	return 0, false, nil
}

type note struct {
	name string
	typ  uint32
	desc []byte
}

// notes iterates over the notes of a note section (4-byte aligned fields).
func notes(b []byte, bo binary.ByteOrder) func(yield func(note, error) bool) {
	return func(yield func(note, error) bool) {
		for len(b) > 0 {
			if len(b) < 12 {
				yield(note{}, fmt.Errorf("truncated ELF note header (%d bytes)", len(b)))
				return
			}
			namesz, descsz, typ := bo.Uint32(b), bo.Uint32(b[4:]), bo.Uint32(b[8:])
			nameEnd := 12 + uint64(namesz)
			descStart := align4(nameEnd)
			descEnd := descStart + uint64(descsz)
			if descEnd > uint64(len(b)) {
				yield(note{}, fmt.Errorf("ELF note of type %d overruns its section", typ))
				return
			}
			name := string(bytes.TrimRight(b[12:nameEnd], "\x00"))
			if !yield(note{name: name, typ: typ, desc: b[descStart:descEnd]}, nil) {
				return
			}
			b = b[min(align4(descEnd), uint64(len(b))):]
		}
	}
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// offKernelVersion holds a pointer to the kernel version string, relative
// to the start of the setup code at 0x200.
const offKernelVersion = 0x20e

// KernelVersion returns the version string the setup header of a bzImage
// points to (e.g. "6.1.0-57-amd64 (debian-kernel@...) #1 SMP ..."), "" if
// it points nowhere, and false when image has no setup header.
func KernelVersion(image []byte) (string, bool) {
	if len(image) < offKernelVersion+2 || string(image[offHeaderMagic:offHeaderMagic+4]) != headerMagic {
		return "", false
	}
	ptr := int(binary.LittleEndian.Uint16(image[offKernelVersion:]))
	if ptr == 0 || ptr+0x200 >= len(image) {
		return "", true
	}
	s := image[ptr+0x200:]
	if end := bytes.IndexByte(s, 0); end >= 0 {
		s = s[:end]
	}
	if len(s) > 256 {
		s = s[:256]
	}
	return string(s), true
}
