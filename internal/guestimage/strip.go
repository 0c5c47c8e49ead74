package guestimage

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
)

// dropSymbols returns vmlinux without its symbol table when it has one:
// QEMU reads an ELF kernel's .symtab at every VM start and sorts it for
// its disassembler (≈ 650 page faults and 1.6 MiB of each QEMU's memory,
// docs/performance.md "QEMU's start"). hack/build-kernel.sh strips Hull's
// kernel with objcopy; a kernel directory of an operator's own build may
// not be. What QEMU boots is the program headers and the bytes they
// cover (the loaded segments and the PT_NOTE holding the PVH entry), so
// the result is the file up to the last of those, without a section
// header table. dropped is how many bytes went; a kernel without a
// symbol table is returned as it is.
func dropSymbols(vmlinux []byte) (out []byte, dropped int, err error) {
	f, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return nil, 0, fmt.Errorf("reading the kernel's ELF: %w", err)
	}
	defer f.Close()
	if f.Class != elf.ELFCLASS64 || f.ByteOrder != binary.LittleEndian {
		return nil, 0, fmt.Errorf("the kernel is a %v %v ELF, want ELFCLASS64 little-endian", f.Class, f.ByteOrder)
	}
	if f.SectionByType(elf.SHT_SYMTAB) == nil {
		return vmlinux, 0, nil
	}
	if len(f.Progs) == 0 {
		return nil, 0, fmt.Errorf("the kernel has no program headers: QEMU cannot load it")
	}
	var hdr elf.Header64
	if err := binary.Read(bytes.NewReader(vmlinux), binary.LittleEndian, &hdr); err != nil {
		return nil, 0, fmt.Errorf("reading the kernel's ELF header: %w", err)
	}
	end := max(hdr.Phoff+uint64(hdr.Phentsize)*uint64(hdr.Phnum), uint64(binary.Size(hdr)))
	for _, p := range f.Progs {
		end = max(end, p.Off+p.Filesz)
	}
	if end > uint64(len(vmlinux)) {
		return nil, 0, fmt.Errorf("the kernel's program headers reach byte %d of a %d-byte file", end, len(vmlinux))
	}
	hdr.Shoff, hdr.Shentsize, hdr.Shnum, hdr.Shstrndx = 0, 0, 0, 0
	var h bytes.Buffer
	if err := binary.Write(&h, binary.LittleEndian, &hdr); err != nil {
		return nil, 0, err
	}
	out = append(h.Bytes(), vmlinux[h.Len():end]...)
	return out, len(vmlinux) - len(out), nil
}
