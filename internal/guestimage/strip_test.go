package guestimage

import (
	"bytes"
	"debug/elf"
	"io"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/guestimage/internal/testkit"
)

// TestDropSymbolsKeepsWhatQEMUBoots: a linked kernel with a symbol table
// loses it and everything after its last segment, and keeps every
// program header and the bytes each covers (the PVH entry among them);
// a kernel without one comes back unchanged.
func TestDropSymbolsKeepsWhatQEMUBoots(t *testing.T) {
	in := testkit.LinkedVmlinux(0x1000a50, 64<<10)
	before, err := elf.NewFile(bytes.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	out, dropped, err := dropSymbols(in)
	if err != nil {
		t.Fatal(err)
	}
	if dropped < 64<<10 || len(out) != len(in)-dropped {
		t.Fatalf("dropped %d bytes: %d → %d, want at least the 64 KiB symbol table", dropped, len(in), len(out))
	}
	after, err := elf.NewFile(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("the result is no ELF: %v", err)
	}
	if len(after.Sections) != 0 {
		t.Errorf("the result has %d sections, want none", len(after.Sections))
	}
	if after.Entry != before.Entry || len(after.Progs) != len(before.Progs) {
		t.Fatalf("entry %#x, %d program headers; want %#x, %d", after.Entry, len(after.Progs), before.Entry, len(before.Progs))
	}
	for i, p := range before.Progs {
		q := after.Progs[i]
		if q.ProgHeader != p.ProgHeader {
			t.Errorf("program header %d: %+v, want %+v", i, q.ProgHeader, p.ProgHeader)
			continue
		}
		want, _ := io.ReadAll(p.Open())
		got, err := io.ReadAll(q.Open())
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("program header %d (%v): its %d bytes differ (%v)", i, p.Type, p.Filesz, err)
		}
	}
	again, n, err := dropSymbols(out)
	if err != nil || n != 0 || !bytes.Equal(again, out) {
		t.Errorf("a kernel without symbols: %d bytes dropped, unchanged %v, %v", n, bytes.Equal(again, out), err)
	}
	// A symbol table but nothing to boot: refused, not cut to its header.
	noSegments := testkit.ELF(2, testkit.Section{Name: ".symtab", Type: 2, Data: []byte("symbols")})
	if _, _, err := dropSymbols(noSegments); err == nil || !strings.Contains(err.Error(), "no program headers") {
		t.Errorf("a kernel without program headers: %v", err)
	}
	if _, _, err := dropSymbols([]byte("not an ELF")); err == nil {
		t.Error("dropSymbols accepted a file that is not an ELF")
	}
}
