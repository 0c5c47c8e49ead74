package kmod

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/guestimage/internal/testkit"
)

func TestReadInfoSynthetic(t *testing.T) {
	ko := testkit.Module("virtio-pci", []string{"virtio_ring", "virtio-pci-modern-dev", "virtio"}, "6.1.0-test SMP")
	info, err := ReadInfo(bytes.NewReader(ko))
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "virtio_pci" || info.Vermagic != "6.1.0-test SMP" ||
		!slices.Equal(info.Depends, []string{"virtio_ring", "virtio_pci_modern_dev", "virtio"}) {
		t.Fatalf("info = %+v", info)
	}
	none, err := ReadInfo(bytes.NewReader(testkit.Module("x", nil, "v")))
	if err != nil || len(none.Depends) != 0 {
		t.Fatalf("empty depends: %+v, %v", none, err)
	}
}

func TestReadInfoErrors(t *testing.T) {
	if _, err := ReadInfo(bytes.NewReader([]byte("not an elf at all, no"))); err == nil {
		t.Error("non-ELF accepted")
	}
	noinfo := testkit.ELF(1, testkit.Section{Name: ".text", Type: 1, Data: []byte{0xc3}})
	if _, err := ReadInfo(bytes.NewReader(noinfo)); err == nil || !strings.Contains(err.Error(), ".modinfo") {
		t.Errorf("ELF without .modinfo: err = %v", err)
	}
}

func TestNameFromPath(t *testing.T) {
	for p, want := range map[string]string{
		"kernel/drivers/char/hw_random/virtio-rng.ko": "virtio_rng",
		"kernel/net/9p/9pnet_virtio.ko.xz":            "9pnet_virtio",
		"kernel/fs/9p/9p.ko":                          "9p",
	} {
		if got, ok := NameFromPath(p); !ok || got != want {
			t.Errorf("NameFromPath(%q) = %q, %v; want %q", p, got, ok, want)
		}
	}
	for _, p := range []string{"kernel/foo.o", "modules.order", ".ko"} {
		if _, ok := NameFromPath(p); ok {
			t.Errorf("NameFromPath(%q) accepted", p)
		}
	}
}

func index(t *testing.T, deps map[string][]string) Index {
	t.Helper()
	ix := Index{}
	for name, d := range deps {
		// Go through real ELF bytes so the resolver is tested on parsed data.
		info, err := ReadInfo(bytes.NewReader(testkit.Module(name, d, "v")))
		if err != nil {
			t.Fatal(err)
		}
		if err := ix.Add(Module{Name: info.Name, Path: "kernel/" + name + ".ko", Depends: info.Depends}); err != nil {
			t.Fatal(err)
		}
	}
	return ix
}

func names(ms []Module) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

func TestResolveOrder(t *testing.T) {
	ix := index(t, map[string][]string{
		"virtio":                {},
		"virtio_ring":           {},
		"virtio_pci_modern_dev": {},
		"virtio_pci":            {"virtio_ring", "virtio-pci-modern-dev", "virtio"},
		"9pnet":                 {},
		"netfs":                 {},
		"fscache":               {"netfs"},
		"9p":                    {"9pnet", "fscache", "netfs"},
		"9pnet_virtio":          {"9pnet", "virtio_ring", "virtio"},
		"unrelated":             {"virtio"},
	})
	got, err := ix.Resolve([]string{"virtio-pci", "9p", "9pnet_virtio", "9p"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"9pnet", "netfs", "fscache", "9p", "virtio", "virtio_pci_modern_dev", "virtio_ring", "9pnet_virtio", "virtio_pci"}
	if !slices.Equal(names(got), want) {
		t.Fatalf("order:\n got %v\nwant %v", names(got), want)
	}
	pos := map[string]int{}
	for i, m := range got {
		pos[m.Name] = i
	}
	for _, m := range got {
		for _, d := range m.Depends {
			if pos[d] > pos[m.Name] {
				t.Errorf("%s placed before its dependency %s", m.Name, d)
			}
		}
	}
	// Same roots in another order: same result.
	again, err := ix.Resolve([]string{"9pnet_virtio", "9p", "virtio_pci"})
	if err != nil || !slices.Equal(names(again), want) {
		t.Fatalf("second resolve: %v, %v", names(again), err)
	}
}

func TestResolveMissing(t *testing.T) {
	ix := index(t, map[string][]string{"virtio_pci": {"virtio_ring"}, "virtio": {}})
	_, err := ix.Resolve([]string{"virtio"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ix.Resolve([]string{"virtio_pci"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "virtio_ring") || !strings.Contains(err.Error(), "needed by virtio_pci") {
		t.Errorf("missing dependency: err = %v", err)
	}
	_, err = ix.Resolve([]string{"virtio-fs"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "virtio_fs") {
		t.Errorf("missing root: err = %v", err)
	}
}

func TestResolveCycle(t *testing.T) {
	ix := index(t, map[string][]string{"a": {"b"}, "b": {"c"}, "c": {"a"}, "root": {"a"}})
	_, err := ix.Resolve([]string{"root"})
	if !errors.Is(err, ErrCycle) || !strings.Contains(err.Error(), "a -> b -> c -> a") {
		t.Errorf("cycle: err = %v", err)
	}
}

func TestIndexDuplicate(t *testing.T) {
	ix := Index{}
	if err := ix.Add(Module{Name: "virtio-rng", Path: "a/virtio-rng.ko"}); err != nil {
		t.Fatal(err)
	}
	if err := ix.Add(Module{Name: "virtio_rng", Path: "b/virtio_rng.ko"}); err == nil {
		t.Error("duplicate module name accepted")
	}
}
