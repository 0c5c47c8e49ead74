// Package run implements `hull run`: one command in a throwaway VM, with
// its stdio wired to the caller's and everything torn down at the end.
package run

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Exit codes for failures before the command ran, as docker and runc use
// them.
const (
	ExitRunFailed     = 125 // hull itself failed (bad flag, missing kernel, VM did not boot)
	ExitCannotExecute = 126 // the command exists but cannot be executed
	ExitNotFound      = 127 // the command is not in the rootfs
)

// minMemoryMiB is the smallest guest that boots Hull's kernel and agent.
const minMemoryMiB = 64

// Options is what `hull run` was asked to do.
type Options struct {
	Rootfs    string
	CPUs      int
	MemoryMiB int
	// TCGCacheMiB is hypervisor.qemu.tcg_cache_size (0: QEMU driver's default).
	TCGCacheMiB int
	// Interactive keeps stdin open and sends it to the command.
	Interactive bool
	// TTY gives the command a terminal.
	TTY  bool
	Env  []string
	Cwd  string
	Args []string

	QEMU         string
	Kernel       string
	Initrd       string
	MachineType  string
	Firmware     string
	KernelParams []string
	// RunDir is the parent of the VM's runtime directory.
	RunDir string
	// Debug keeps the guest console: it is copied to stderr at the end.
	Debug bool
}

// UsageError is a bad request: the message names the flag, value or path.
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &UsageError{msg: fmt.Sprintf(format, args...)}
}

// Validate checks everything that can be checked before any resource is
// acquired, so bad input leaves nothing behind.
func (o *Options) Validate() error {
	var errs []error
	// QEMU runs in another directory: hand it absolute paths.
	for _, p := range []*string{&o.Rootfs, &o.Kernel, &o.Initrd} {
		if *p != "" {
			if abs, err := filepath.Abs(*p); err == nil {
				*p = abs
			}
		}
	}
	if len(o.Args) == 0 {
		errs = append(errs, usagef("no command given: usage: hull run --rootfs DIR [flags] -- CMD [ARGS...]"))
	}
	if o.Rootfs == "" {
		errs = append(errs, usagef("--rootfs is required"))
	} else if fi, err := os.Stat(o.Rootfs); err != nil {
		errs = append(errs, usagef("rootfs %s: %v", o.Rootfs, pathErr(err)))
	} else if !fi.IsDir() {
		errs = append(errs, usagef("rootfs %s: not a directory", o.Rootfs))
	}
	if o.CPUs < 1 {
		errs = append(errs, usagef("invalid --cpus %d: must be at least 1", o.CPUs))
	}
	if o.MemoryMiB < minMemoryMiB {
		errs = append(errs, usagef("invalid --memory %d: must be at least %d (MiB)", o.MemoryMiB, minMemoryMiB))
	}
	for _, kv := range o.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, usagef("invalid -e %q: want KEY=VALUE", kv))
		}
	}
	if o.Cwd != "" && !strings.HasPrefix(o.Cwd, "/") {
		errs = append(errs, usagef("invalid -w %q: must be an absolute path", o.Cwd))
	}
	for _, f := range []struct{ what, path string }{{"kernel", o.Kernel}, {"initrd", o.Initrd}} {
		if f.path == "" {
			errs = append(errs, usagef("no guest %s configured", f.what))
			continue
		}
		if fi, err := os.Stat(f.path); err != nil {
			errs = append(errs, usagef("guest %s %s: %v (build it with `make guest` or `hull guest build`)", f.what, f.path, pathErr(err)))
		} else if !fi.Mode().IsRegular() {
			errs = append(errs, usagef("guest %s %s: not a regular file", f.what, f.path))
		}
	}
	return errors.Join(errs...)
}

// pathErr drops the path from an *os.PathError: callers name it already.
func pathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
