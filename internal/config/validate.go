package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Limits of the numeric keys (the QEMU driver accepts the same ranges).
const (
	MinMemoryMiB     = 64
	MaxMemoryMiB     = 1 << 20 // 1 TiB
	MaxVCPUs         = 255
	MinTCGCacheMiB   = 8
	MaxTCGCacheMiB   = 2048
	MaxDialTimeout   = 600  // seconds
	MaxCreateTimeout = 3600 // seconds
)

var moduleNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// validator collects the errors of one configuration.
type validator struct {
	file  string
	lines map[string]int
	errs  []error
}

func (v *validator) bad(key string, value any, format string, a ...any) {
	var val string
	switch x := value.(type) {
	case string:
		val = strconv.Quote(x)
	case []string:
		q := make([]string, len(x))
		for i, s := range x {
			q[i] = strconv.Quote(s)
		}
		val = "[" + strings.Join(q, ", ") + "]"
	default:
		val = fmt.Sprint(x)
	}
	v.errs = append(v.errs, &Error{File: v.file, Line: v.lines[key], Key: key, Value: val, Msg: fmt.Sprintf(format, a...)})
}

func (v *validator) oneOf(key, value string, allowed []string) {
	if !slices.Contains(allowed, value) {
		v.bad(key, value, "must be one of %s", quoteList(allowed))
	}
}

func (v *validator) intRange(key string, value, lo, hi int, unit string) {
	switch {
	case value < lo:
		v.bad(key, value, "must be at least %d%s", lo, unit)
	case value > hi:
		v.bad(key, value, "must be at most %d%s", hi, unit)
	}
}

// absPath checks a path that must be absolute (empty only if optional).
func (v *validator) absPath(key, value string, optional bool) {
	switch {
	case value == "" && optional:
	case value == "":
		v.bad(key, value, "must be an absolute path")
	case !filepath.IsAbs(value):
		v.bad(key, value, "must be an absolute path, not relative")
	}
}

// validate checks every value of c; errors name file, key (with the line
// where lines knows it), value and what is allowed.
func (c *Config) validate(file string, lines map[string]int) error {
	v := &validator{file: file, lines: lines}
	const hq = "hypervisor.qemu."
	h := c.Hypervisor
	// "" is Hull's choice (docs/qemu.md).
	if strings.Contains(h.Path, "/") && !filepath.IsAbs(h.Path) {
		v.bad(hq+"path", h.Path, "must be an absolute path or a command name looked up on PATH, not a relative path")
	}
	v.absPath(hq+"kernel", h.Kernel, false)
	v.absPath(hq+"initrd", h.Initrd, false)
	v.oneOf(hq+"machine_type", h.MachineType, MachineTypes)
	v.absPath(hq+"firmware", h.Firmware, true)
	for _, p := range h.KernelParams {
		if strings.ContainsAny(p, `"'`) {
			v.bad(hq+"kernel_params", strings.Join(h.KernelParams, " "), "parameter %s must not contain quotes", p)
			break
		}
	}
	v.intRange(hq+"default_vcpus", h.DefaultVCPUs, 1, MaxVCPUs, "")
	if h.DefaultMaxVCPUs != 0 && (h.DefaultMaxVCPUs < h.DefaultVCPUs || h.DefaultMaxVCPUs > MaxVCPUs) {
		v.bad(hq+"default_maxvcpus", h.DefaultMaxVCPUs,
			"must be 0 (the number of host CPUs) or from default_vcpus (%d) to %d", h.DefaultVCPUs, MaxVCPUs)
	}
	v.intRange(hq+"default_memory", h.DefaultMemory, MinMemoryMiB, MaxMemoryMiB, " (MiB)")
	if h.DefaultMaxMemory != 0 && (h.DefaultMaxMemory < h.DefaultMemory || h.DefaultMaxMemory > MaxMemoryMiB) {
		v.bad(hq+"default_maxmemory", h.DefaultMaxMemory,
			"must be 0 (the host's memory) or from default_memory (%d) to %d (MiB)", h.DefaultMemory, MaxMemoryMiB)
	}
	v.intRange(hq+"tcg_cache_size", h.TCGCacheSize, MinTCGCacheMiB, MaxTCGCacheMiB, " (MiB)")
	v.oneOf(hq+"shared_fs", h.SharedFS, SharedFSTypes)
	v.absPath(hq+"virtio_fs_daemon", h.VirtioFSDaemon, h.SharedFS != "virtio-fs")
	v.oneOf(hq+"block_device_driver", h.BlockDeviceDriver, BlockDeviceDrivers)

	a := c.Agent
	v.intRange("agent.dial_timeout", a.DialTimeout, 1, MaxDialTimeout, " (seconds)")
	for _, m := range a.KernelModules {
		name, _, _ := strings.Cut(strings.TrimSpace(m), " ")
		if !moduleNameRE.MatchString(name) {
			v.bad("agent.kernel_modules", a.KernelModules,
				"entry %q must be a module name ([A-Za-z0-9_-]) followed by optional param=value words", m)
			break
		}
	}

	r := c.Runtime
	v.oneOf("runtime.internetworking_model", r.InternetworkingModel, InternetworkingModels)
	v.intRange("runtime.create_container_timeout", r.CreateContainerTimeout, 1, MaxCreateTimeout, " (seconds)")
	v.absPath("runtime.state_dir", r.StateDir, false)
	for _, e := range r.Experimental {
		if !slices.Contains(ExperimentalFeatures, e) {
			if len(ExperimentalFeatures) == 0 {
				v.bad("runtime.experimental", r.Experimental, "unknown feature %q: this version has no experimental features", e)
			} else {
				v.bad("runtime.experimental", r.Experimental, "unknown feature %q: must be among %s", e, quoteList(ExperimentalFeatures))
			}
			break
		}
	}
	return errors.Join(v.errs...)
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = strconv.Quote(x)
	}
	return strings.Join(q, ", ")
}
