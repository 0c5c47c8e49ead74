package guestimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/hull-runtime/hull/internal/guestimage/kmod"
)

// kernel is what the builder needs from a kernel package.
type kernel struct {
	release    string
	vmlinuz    []byte
	index      kmod.Index
	compressed map[string]string // module name -> path, for modules shipped compressed
}

// maxMember bounds any single file read into memory from the package.
const maxMember = 256 << 20

// scanKernel reads the kernel image and the metadata of every module from
// the package tree, keeping no module contents.
func scanKernel(ctx context.Context, src tarSource) (*kernel, error) {
	k := &kernel{index: kmod.Index{}, compressed: map[string]string{}}
	var buf bytes.Buffer
	var moduleRelease string
	err := walkTar(ctx, src, func(name string, h *tar.Header, r io.Reader) error {
		if rel, ok := strings.CutPrefix(name, "boot/vmlinuz-"); ok && !strings.Contains(rel, "/") {
			if k.release != "" {
				return fmt.Errorf("kernel package holds two kernels: %s and %s", k.release, rel)
			}
			b, err := readMember(name, h, r)
			if err != nil {
				return err
			}
			k.release, k.vmlinuz = rel, b
			return nil
		}
		rest, ok := strings.CutPrefix(name, "lib/modules/")
		if !ok {
			return nil
		}
		rel, modPath, ok := strings.Cut(rest, "/")
		if !ok || !strings.HasPrefix(modPath, "kernel/") {
			return nil
		}
		modName, ok := kmod.NameFromPath(modPath)
		if !ok {
			return nil
		}
		if moduleRelease != "" && moduleRelease != rel {
			return fmt.Errorf("kernel package holds modules for two releases: %s and %s", moduleRelease, rel)
		}
		moduleRelease = rel
		if !strings.HasSuffix(modPath, ".ko") {
			k.compressed[modName] = modPath
			return nil
		}
		buf.Reset()
		if h.Size > maxMember {
			return fmt.Errorf("module %s: %d bytes is implausibly large", name, h.Size)
		}
		if _, err := io.Copy(&buf, r); err != nil {
			return fmt.Errorf("reading module %s: %w", name, err)
		}
		info, err := kmod.ReadInfo(bytes.NewReader(buf.Bytes()))
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		if info.Name != "" && info.Name != modName {
			return fmt.Errorf("module %s calls itself %s", name, info.Name)
		}
		return k.index.Add(kmod.Module{Name: modName, Path: modPath, Depends: info.Depends})
	})
	if err != nil {
		return nil, err
	}
	if k.release == "" {
		return nil, fmt.Errorf("kernel package has no boot/vmlinuz-*")
	}
	if moduleRelease != "" && moduleRelease != k.release {
		return nil, fmt.Errorf("kernel package: vmlinuz is release %s but modules are for %s", k.release, moduleRelease)
	}
	return k, nil
}

// resolveModules returns the closure of roots in load order, with an error
// naming any module the package lacks.
func (k *kernel) resolveModules(roots []string) ([]kmod.Module, error) {
	mods, err := k.index.Resolve(roots)
	if err != nil {
		var nf *kmod.NotFoundError
		if errors.As(err, &nf) && k.compressed[nf.Name] != "" {
			return nil, fmt.Errorf("selecting kernel modules for %s: %w (the package ships it compressed as %s, which is not supported)",
				k.release, err, k.compressed[nf.Name])
		}
		return nil, fmt.Errorf("selecting kernel modules for %s: %w", k.release, err)
	}
	return mods, nil
}

// readModules reads the contents of mods from the package tree, stopping as
// soon as all are found.
func readModules(ctx context.Context, src tarSource, release string, mods []kmod.Module) (map[string][]byte, error) {
	want := map[string]string{} // member name -> module path
	for _, m := range mods {
		want["lib/modules/"+release+"/"+m.Path] = m.Path
	}
	got := make(map[string][]byte, len(mods))
	err := walkTar(ctx, src, func(name string, h *tar.Header, r io.Reader) error {
		p, ok := want[name]
		if !ok {
			return nil
		}
		b, err := readMember(name, h, r)
		if err != nil {
			return err
		}
		got[p] = b
		if len(got) == len(want) {
			return errStop
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(got) != len(want) {
		var missing []string
		for _, m := range mods {
			if got[m.Path] == nil {
				missing = append(missing, m.Path)
			}
		}
		slices.Sort(missing)
		return nil, fmt.Errorf("kernel package changed while reading: modules %s vanished", strings.Join(missing, ", "))
	}
	return got, nil
}

func readMember(name string, h *tar.Header, r io.Reader) ([]byte, error) {
	if h.Size > maxMember {
		return nil, fmt.Errorf("%s: %d bytes is implausibly large", name, h.Size)
	}
	b := make([]byte, h.Size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return b, nil
}
