package guestimage

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/guestimage/bzimage"
)

// Kernel choices for the guest image (hull guest build --kernel).
const (
	// KernelHull is Hull's own kernel, built from Debian's linux-source
	// with guest/kernel/hull.config by hack/build-kernel.sh: everything
	// built in, so the initramfs carries no modules.
	KernelHull = "hull"
	// KernelDebian is Debian's packaged kernel plus the module closure.
	KernelDebian = "debian"
)

// buildFromDir writes the outputs from a kernel built with everything
// built in: dir holds vmlinux (the ELF QEMU boots through PVH) and vmlinuz
// (its bzImage). The initramfs holds the agent and no modules.
func buildFromDir(ctx context.Context, opts Options) (Result, error) {
	start := time.Now()
	bins, err := readBinaries(opts)
	if err != nil {
		return Result{}, err
	}
	vmlinuxPath := filepath.Join(opts.KernelDir, VmlinuxName)
	vmlinux, err := os.ReadFile(vmlinuxPath)
	if err != nil {
		return Result{}, fmt.Errorf("reading the built kernel: %w", err)
	}
	vmlinuz, err := os.ReadFile(filepath.Join(opts.KernelDir, VmlinuzName))
	if err != nil {
		return Result{}, fmt.Errorf("reading the built kernel: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	release, err := builtRelease(opts.KernelDir, vmlinux, vmlinuz)
	if err != nil {
		return Result{}, err
	}
	vmlinux, dropped, err := dropSymbols(vmlinux)
	if err != nil {
		return Result{}, fmt.Errorf("%s: %w", vmlinuxPath, err)
	}
	if dropped > 0 {
		fmt.Fprintf(opts.Log, "%s: its symbol table and what follows its segments dropped (%s), which QEMU would read at every VM start\n",
			vmlinuxPath, mib(int64(dropped)))
	}
	entry, pvh, err := bzimage.PVHEntry(vmlinux)
	if err != nil {
		return Result{}, fmt.Errorf("reading the PVH entry of %s: %w", vmlinuxPath, err)
	}
	if err := os.MkdirAll(opts.OutDir, 0o755); err != nil {
		return Result{}, fmt.Errorf("creating output directory: %w", err)
	}
	initrd, rawLen, _, err := packInitramfs(bins, release, nil, nil, opts.Compression)
	if err != nil {
		return Result{}, err
	}
	res := Result{KernelRelease: release, PVH: pvh, PVHEntry: entry, InitrdRaw: rawLen}
	if err := writeOutputs(opts.OutDir, &res, vmlinux, vmlinuz, initrd); err != nil {
		return Result{}, err
	}
	res.Duration = time.Since(start)
	logResult(opts.Log, res)
	return res, nil
}

// builtRelease checks that vmlinux is an x86-64 ELF and returns the
// release its bzImage's setup header names (e.g. "6.1.192-hull").
func builtRelease(dir string, vmlinux, vmlinuz []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(vmlinux))
	if err != nil {
		return "", fmt.Errorf("%s is not an ELF kernel: %w", filepath.Join(dir, VmlinuxName), err)
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 {
		return "", fmt.Errorf("%s is built for %v, want x86-64", filepath.Join(dir, VmlinuxName), f.Machine)
	}
	v, ok := bzimage.KernelVersion(vmlinuz)
	if !ok {
		return "", fmt.Errorf("%s is not a bzImage (no setup header)", filepath.Join(dir, VmlinuzName))
	}
	release, _, _ := strings.Cut(v, " ")
	if release == "" {
		return "", errors.New("kernel " + filepath.Join(dir, VmlinuzName) + " names no version")
	}
	return release, nil
}
