// Package config holds Hull's configuration: built-in defaults (the embedded
// defaults.toml), which a configuration file may override.
package config

import (
	_ "embed"
	"fmt"
)

// Default install locations of the guest image (make install puts them here).
// defaults.toml uses the same values; a test keeps them in step.
const (
	DefaultAssetDir = "/usr/share/hull"
	DefaultKernel   = DefaultAssetDir + "/vmlinux"
	DefaultInitrd   = DefaultAssetDir + "/hull-initrd.img"
	// DefaultQEMU, empty, is Hull's own QEMU when it is on PATH, else the
	// distribution's (internal/vm/qemu DefaultBinary, docs/qemu.md).
	DefaultQEMU  = ""
	DefaultQboot = "/usr/share/qemu/qboot.rom"
	// DefaultRunDir holds one directory per sandbox (runtime.state_dir).
	DefaultRunDir = "/run/hull"
	// DefaultCommandRunDir holds the directory of a `hull run` VM while it
	// boots: apart from the sandboxes', so that `hull ps` and `hull gc`
	// never meet a directory without a state record.
	DefaultCommandRunDir = "/run/hull-run"
	// DefaultPath is the configuration file read when no other is named.
	DefaultPath = "/etc/hull/config.toml"
	// EnvVar names a configuration file to read instead of DefaultPath.
	EnvVar = "HULL_CONFIG"
)

// DefaultsTOML is the built-in configuration, which is also the documented
// reference file (install it as /usr/share/hull/config.toml).
//
//go:embed defaults.toml
var DefaultsTOML []byte

// defaultsName names the embedded file in errors and in Source.
const defaultsName = "built-in defaults"

// Defaults is the configuration Hull runs with when there is no file.
func Defaults() Config {
	var c Config
	if _, err := decodeInto(&c, defaultsName, DefaultsTOML); err != nil {
		// defaults.toml is part of the binary and tested: this is a build bug.
		panic(fmt.Sprintf("config: embedded defaults.toml: %v", err))
	}
	if err := c.validate(defaultsName, nil); err != nil {
		panic(fmt.Sprintf("config: embedded defaults.toml: %v", err))
	}
	return c
}
