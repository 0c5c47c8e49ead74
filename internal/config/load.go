package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Origins of a configuration, as reported in Source.
const (
	OriginBuiltin     = "built-in defaults"
	OriginExplicit    = "explicit path"
	OriginEnv         = EnvVar
	OriginDefaultPath = "default path"
)

// Source says where a configuration came from.
type Source struct {
	// Path is the file read over the built-in defaults, "" if none.
	Path string `json:"path,omitempty"`
	// Origin is one of the Origin* constants.
	Origin string `json:"origin"`
}

func (s Source) String() string {
	if s.Path == "" {
		return OriginBuiltin
	}
	return s.Path + " (" + s.Origin + ")"
}

// Loader finds and reads the configuration file.
type Loader struct {
	// DefaultPath is read when no explicit path or HULL_CONFIG names a
	// file; "" means DefaultPath (/etc/hull/config.toml). Tests set it.
	DefaultPath string
}

// Load reads the configuration with the default Loader: see Loader.Load.
func Load(explicitPath string) (*Config, Source, []Warning, error) {
	return (&Loader{}).Load(explicitPath)
}

// Load returns the built-in defaults overridden by the first configuration
// file of: explicitPath (containerd's ConfigPath option, `--config`), the
// file named by $HULL_CONFIG, l.DefaultPath. A missing default file means
// the built-in defaults alone; a missing explicit or $HULL_CONFIG file is an
// error naming it. Warnings name keys that were ignored.
func (l *Loader) Load(explicitPath string) (*Config, Source, []Warning, error) {
	src := Source{Path: explicitPath, Origin: OriginExplicit}
	if src.Path == "" {
		src = Source{Path: os.Getenv(EnvVar), Origin: OriginEnv}
	}
	required := src.Path != ""
	if !required {
		src = Source{Path: l.DefaultPath, Origin: OriginDefaultPath}
		if src.Path == "" {
			src.Path = DefaultPath
		}
	}
	data, err := os.ReadFile(src.Path)
	if err != nil {
		if !required && errors.Is(err, fs.ErrNotExist) {
			c := Defaults()
			return &c, Source{Origin: OriginBuiltin}, nil, nil
		}
		return nil, src, nil, fmt.Errorf("reading configuration file %s (%s): %w", src.Path, src.Origin, err)
	}
	c, warnings, err := Parse(src.Path, data)
	return c, src, warnings, err
}

// Parse returns the built-in defaults overridden by the TOML document data,
// validated. name (the file's path) prefixes every error and warning.
func Parse(name string, data []byte) (*Config, []Warning, error) {
	c := Defaults()
	d, err := decodeInto(&c, name, data)
	if err != nil {
		return nil, d.warnings, err
	}
	if err := c.validate(name, d.lines); err != nil {
		return nil, d.warnings, err
	}
	return &c, append(d.warnings, c.noEffect(name, d.lines)...), nil
}

// noEffect warns about keys this version accepts (so a Kata file loads)
// but does not act on yet, when the file sets them away from the default:
// the user should not believe they took effect.
func (c *Config) noEffect(file string, lines map[string]int) []Warning {
	def := Defaults()
	var ws []Warning
	warn := func(key, msg string) {
		ws = append(ws, Warning{File: file, Line: lines[key], Key: key, Msg: msg})
	}
	if c.Hypervisor.SharedFS != def.Hypervisor.SharedFS {
		warn("hypervisor.qemu.shared_fs", fmt.Sprintf("%q is not supported yet: containers' filesystems are shared over virtio-9p", c.Hypervisor.SharedFS))
	}
	if c.Hypervisor.DisableBlockDeviceUse != def.Hypervisor.DisableBlockDeviceUse {
		warn("hypervisor.qemu.disable_block_device_use", "has no effect yet: rootfs is never passed as a block device")
	}
	if len(c.Agent.KernelModules) > 0 {
		warn("agent.kernel_modules", "has no effect yet: the guest loads the modules built into its initramfs")
	}
	if !c.Runtime.SandboxCgroupOnly {
		warn("runtime.sandbox_cgroup_only", "false: QEMU stays in the shim's cgroup, and the pod cgroup's limits do not bound the VM")
	}
	if c.Runtime.DisableGuestSeccomp != def.Runtime.DisableGuestSeccomp {
		warn("runtime.disable_guest_seccomp", "has no effect yet: the agent applies no seccomp profile")
	}
	return ws
}
