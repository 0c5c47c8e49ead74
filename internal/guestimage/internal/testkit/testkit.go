// Package testkit builds synthetic kernel artefacts for guestimage tests:
// minimal ELF files (kernel modules with a .modinfo section, a vmlinux with
// notes) and bzImage files around a payload.
package testkit

import (
	"bytes"
	"encoding/binary"
	"strings"
)

// Section is one ELF section to emit.
type Section struct {
	Name string
	Type uint32 // SHT_*
	Data []byte
}

// Segment is a program header over one of the sections of Exec.
type Segment struct {
	Type    uint32 // PT_*
	Section int    // the index of the section it covers
	Vaddr   uint64
}

// ELF returns a little-endian ELF64 x86-64 file of type typ (1 = ET_REL,
// 2 = ET_EXEC) holding sections plus .shstrtab, readable by debug/elf.
func ELF(typ uint16, sections ...Section) []byte { return build(typ, nil, sections) }

// Exec returns an ET_EXEC file as ELF does, with program headers for
// segments right after its file header, as a linked kernel has.
func Exec(segments []Segment, sections ...Section) []byte { return build(2, segments, sections) }

func build(typ uint16, segments []Segment, sections []Section) []byte {
	const ehsize, shentsize, phentsize = 64, 64, 56
	var shstr bytes.Buffer
	shstr.WriteByte(0)
	nameOff := make([]uint32, len(sections)+1)
	for i, s := range sections {
		nameOff[i] = uint32(shstr.Len())
		shstr.WriteString(s.Name)
		shstr.WriteByte(0)
	}
	nameOff[len(sections)] = uint32(shstr.Len())
	shstr.WriteString(".shstrtab\x00")
	all := append(append([]Section{}, sections...), Section{Name: ".shstrtab", Type: 3, Data: shstr.Bytes()})

	body := bytes.NewBuffer(make([]byte, ehsize+phentsize*len(segments)))
	offs := make([]uint64, len(all))
	for i, s := range all {
		for body.Len()%8 != 0 {
			body.WriteByte(0)
		}
		offs[i] = uint64(body.Len())
		body.Write(s.Data)
	}
	for body.Len()%8 != 0 {
		body.WriteByte(0)
	}
	shoff := uint64(body.Len())
	le := binary.LittleEndian
	sh := make([]byte, shentsize) // null section
	body.Write(sh)
	for i, s := range all {
		sh := make([]byte, shentsize)
		le.PutUint32(sh[0:], nameOff[i])
		le.PutUint32(sh[4:], s.Type)
		le.PutUint64(sh[24:], offs[i])
		le.PutUint64(sh[32:], uint64(len(s.Data)))
		le.PutUint64(sh[48:], 1) // addralign
		if s.Type == 7 {         // SHT_NOTE
			le.PutUint64(sh[48:], 4)
		}
		body.Write(sh)
	}
	b := body.Bytes()
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = 2, 1, 1 // ELFCLASS64, little endian, EV_CURRENT
	le.PutUint16(b[16:], typ)
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[40:], shoff)
	le.PutUint16(b[52:], ehsize)
	le.PutUint16(b[58:], shentsize)
	le.PutUint16(b[60:], uint16(len(all)+1))
	le.PutUint16(b[62:], uint16(len(all))) // shstrndx
	if len(segments) > 0 {
		le.PutUint64(b[32:], ehsize) // phoff
		le.PutUint16(b[54:], phentsize)
		le.PutUint16(b[56:], uint16(len(segments)))
	}
	for i, g := range segments {
		ph := b[ehsize+phentsize*i:]
		size := uint64(len(sections[g.Section].Data))
		le.PutUint32(ph[0:], g.Type)
		le.PutUint32(ph[4:], 5) // PF_R|PF_X
		le.PutUint64(ph[8:], offs[g.Section])
		le.PutUint64(ph[16:], g.Vaddr)
		le.PutUint64(ph[24:], g.Vaddr)
		le.PutUint64(ph[32:], size)
		le.PutUint64(ph[40:], size)
		le.PutUint64(ph[48:], 4)
	}
	return b
}

// Module returns a synthetic kernel module: an ET_REL ELF whose .modinfo
// section holds name=, depends= (comma separated) and vermagic= fields.
func Module(name string, depends []string, vermagic string) []byte {
	info := "license=GPL\x00depends=" + strings.Join(depends, ",") + "\x00name=" + name +
		"\x00vermagic=" + vermagic + "\x00"
	return ELF(1,
		Section{Name: ".text", Type: 1, Data: []byte{0xc3}},
		Section{Name: ".modinfo", Type: 1, Data: []byte(info)},
	)
}

// Note encodes one ELF note.
func Note(name string, typ uint32, desc []byte) []byte {
	le := binary.LittleEndian
	var b bytes.Buffer
	hdr := make([]byte, 12)
	le.PutUint32(hdr[0:], uint32(len(name)+1))
	le.PutUint32(hdr[4:], uint32(len(desc)))
	le.PutUint32(hdr[8:], typ)
	b.Write(hdr)
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	b.Write(desc)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}

// Vmlinux returns an ET_EXEC ELF with a .notes section; with pvh it carries a
// Xen PHYS32_ENTRY note (type 18) pointing at entry.
func Vmlinux(pvh bool, entry uint32, filler int) []byte {
	notes := Note("Linux", 6, []byte("6.1.0-test\x00"))
	if pvh {
		d := make([]byte, 4)
		binary.LittleEndian.PutUint32(d, entry)
		notes = append(notes, Note("Xen", 18, d)...)
	}
	text := bytes.Repeat([]byte{0x90, 0xe8, 0x10, 0x00, 0x00, 0x00, 0xc3}, filler)
	return ELF(2,
		Section{Name: ".text", Type: 1, Data: text},
		Section{Name: ".notes", Type: 7, Data: notes},
	)
}

// BzImage wraps payload in a minimal x86 boot image: setupSects sectors of
// real-mode setup after the boot sector, a "HdrS" header version 2.15, and
// the payload at payloadOffset inside the protected-mode part.
func BzImage(setupSects uint8, payloadOffset uint32, payload []byte) []byte {
	sects := int(setupSects)
	if sects == 0 {
		sects = 4
	}
	pm := (sects + 1) * 512
	b := make([]byte, pm+int(payloadOffset)+len(payload)+64)
	le := binary.LittleEndian
	b[0x1f1] = setupSects
	le.PutUint16(b[0x1fe:], 0xaa55)
	copy(b[0x202:], "HdrS")
	le.PutUint16(b[0x206:], 0x020f)
	b[0x211] = 0x01 // LOADED_HIGH
	le.PutUint32(b[0x248:], payloadOffset)
	le.PutUint32(b[0x24c:], uint32(len(payload)))
	copy(b[pm+int(payloadOffset):], payload)
	return b
}

// LinkedVmlinux returns a vmlinux as a kernel build leaves it: a PT_LOAD
// segment over its .text, a PT_NOTE over its PVH entry note, and after
// them a .symtab and .strtab of symbols bytes each, which objcopy
// --strip-all would remove.
func LinkedVmlinux(entry uint32, symbols int) []byte {
	d := make([]byte, 4)
	binary.LittleEndian.PutUint32(d, entry)
	return Exec([]Segment{{Type: 1, Section: 0, Vaddr: 0x1000000}, {Type: 4, Section: 1, Vaddr: 0x1800000}},
		Section{Name: ".text", Type: 1, Data: bytes.Repeat([]byte{0x90, 0xc3}, 512)},
		Section{Name: ".notes", Type: 7, Data: Note("Xen", 18, d)},
		Section{Name: ".symtab", Type: 2, Data: bytes.Repeat([]byte{0x5a}, symbols)},
		Section{Name: ".strtab", Type: 3, Data: bytes.Repeat([]byte("sym\x00"), symbols/4)},
	)
}
