// Package kmod reads Linux kernel module metadata and resolves the load
// order of a set of modules, without modules.dep or depmod: dependencies come
// from each module's .modinfo ELF section.
package kmod

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// Sentinel errors; the returned errors wrap them and name the module.
var (
	ErrNotFound = errors.New("module not found")
	ErrCycle    = errors.New("module dependency cycle")
)

// NotFoundError reports a wanted module missing from the index; it matches
// ErrNotFound with errors.Is.
type NotFoundError struct {
	Name     string // normalised
	NeededBy string // the module that depends on it; empty for a root
}

func (e *NotFoundError) Error() string {
	if e.NeededBy == "" {
		return fmt.Sprintf("module %s: %v in the kernel package", e.Name, ErrNotFound)
	}
	return fmt.Sprintf("module %s (needed by %s): %v in the kernel package", e.Name, e.NeededBy, ErrNotFound)
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// Info is what a module's .modinfo section says about it.
type Info struct {
	Name     string   // normalised (see Normalize); empty if the section has no name=
	Depends  []string // normalised, in the order listed
	Vermagic string
}

// Module is a module file inside a kernel's module tree.
type Module struct {
	Name    string   // normalised
	Path    string   // relative to lib/modules/<release>/, e.g. "kernel/fs/9p/9p.ko"
	Depends []string // normalised
}

// Normalize returns the canonical spelling of a module name: the kernel
// treats '-' and '_' alike, and this package uses '_'.
func Normalize(name string) string { return strings.ReplaceAll(name, "-", "_") }

// NameFromPath derives a module's name from its file name
// ("hw_random/virtio-rng.ko" -> "virtio_rng"), with or without a
// compression suffix. ok is false if p is not a module file.
func NameFromPath(p string) (name string, ok bool) {
	base := path.Base(p)
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if n, found := strings.CutSuffix(base, ext); found && n != "" {
			return Normalize(n), true
		}
	}
	return "", false
}

// ReadInfo parses the .modinfo section of an uncompressed module.
func ReadInfo(r io.ReaderAt) (Info, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return Info{}, fmt.Errorf("reading module ELF: %w", err)
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return Info{}, errors.New("reading module ELF: no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return Info{}, fmt.Errorf("reading .modinfo: %w", err)
	}
	return ParseModinfo(data), nil
}

// ParseModinfo parses the NUL-separated key=value strings of a .modinfo
// section.
func ParseModinfo(data []byte) Info {
	var info Info
	for field := range bytes.SplitSeq(data, []byte{0}) {
		key, val, ok := strings.Cut(string(field), "=")
		if !ok {
			continue
		}
		switch key {
		case "name":
			info.Name = Normalize(val)
		case "vermagic":
			info.Vermagic = val
		case "depends":
			for d := range strings.SplitSeq(val, ",") {
				if d = strings.TrimSpace(d); d != "" {
					info.Depends = append(info.Depends, Normalize(d))
				}
			}
		}
	}
	return info
}

// Index maps normalised module names to modules.
type Index map[string]Module

// Add records m under its normalised name; a second module of the same name
// is an error naming both files.
func (ix Index) Add(m Module) error {
	m.Name = Normalize(m.Name)
	if old, ok := ix[m.Name]; ok {
		return fmt.Errorf("module %s is provided by both %s and %s", m.Name, old.Path, m.Path)
	}
	ix[m.Name] = m
	return nil
}

// Resolve returns roots and everything they depend on, dependencies before
// their dependents; among modules whose dependencies are all placed, the
// lexically smallest name comes first, so the order is deterministic.
func (ix Index) Resolve(roots []string) ([]Module, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var stack []string
	var visit func(name, neededBy string) error
	visit = func(name, neededBy string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			i := slices.Index(stack, name)
			cycle := append(slices.Clone(stack[i:]), name)
			return fmt.Errorf("module %s: %w: %s", name, ErrCycle, strings.Join(cycle, " -> "))
		}
		m, ok := ix[name]
		if !ok {
			return &NotFoundError{Name: name, NeededBy: neededBy}
		}
		state[name] = visiting
		stack = append(stack, name)
		for _, d := range m.Depends {
			if err := visit(Normalize(d), name); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		state[name] = done
		return nil
	}
	for _, r := range roots {
		if err := visit(Normalize(r), ""); err != nil {
			return nil, err
		}
	}

	// Kahn's algorithm over the closure, always taking the smallest ready name.
	pending := map[string]int{} // unplaced dependency count
	dependents := map[string][]string{}
	var ready []string
	for name := range state {
		deps := uniq(ix[name].Depends)
		pending[name] = len(deps)
		for _, d := range deps {
			dependents[d] = append(dependents[d], name)
		}
		if len(deps) == 0 {
			ready = append(ready, name)
		}
	}
	out := make([]Module, 0, len(state))
	for len(ready) > 0 {
		slices.Sort(ready)
		name := ready[0]
		ready = ready[1:]
		out = append(out, ix[name])
		for _, d := range dependents[name] {
			if pending[d]--; pending[d] == 0 {
				ready = append(ready, d)
			}
		}
	}
	if len(out) != len(state) { // unreachable after the DFS above; kept as a guard
		return nil, fmt.Errorf("resolving modules: %w", ErrCycle)
	}
	return out, nil
}

func uniq(names []string) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		n = Normalize(n)
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
