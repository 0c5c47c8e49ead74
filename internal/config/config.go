package config

import (
	"strings"
	"time"
)

// Config is the whole configuration. Field tags give each key's name in
// its section; see defaults.toml for what each key means.
type Config struct {
	// Hypervisor is the [hypervisor.qemu] section.
	Hypervisor Hypervisor `json:"hypervisor"`
	// Agent is the [agent] section (Kata's [agent.kata] keys map onto it).
	Agent Agent `json:"agent"`
	// Runtime is the [runtime] section.
	Runtime Runtime `json:"runtime"`
	// Factory is the [factory] section (VM templates, Kata's name).
	Factory Factory `json:"factory"`
}

// Factory is the [factory] section.
type Factory struct {
	// EnableTemplate restores pod VMs from a template of the same shape
	// instead of booting them (docs/templates.md).
	EnableTemplate bool `toml:"enable_template" json:"enable_template"`
}

// Hypervisor is the [hypervisor.qemu] section: key names follow Kata's
// configuration.toml where the meaning is the same.
type Hypervisor struct {
	Path        string `toml:"path" json:"path"`
	Kernel      string `toml:"kernel" json:"kernel"`
	Initrd      string `toml:"initrd" json:"initrd"`
	MachineType string `toml:"machine_type" json:"machine_type"`
	Firmware    string `toml:"firmware" json:"firmware"`
	// KernelParams is a space-separated string in the file, as in Kata.
	KernelParams          []string `toml:"kernel_params,fields" json:"kernel_params"`
	DefaultVCPUs          int      `toml:"default_vcpus" json:"default_vcpus"`
	DefaultMaxVCPUs       int      `toml:"default_maxvcpus" json:"default_maxvcpus"`
	DefaultMemory         int      `toml:"default_memory" json:"default_memory"`       // MiB
	DefaultMaxMemory      int      `toml:"default_maxmemory" json:"default_maxmemory"` // MiB, 0: host memory
	TCGCacheSize          int      `toml:"tcg_cache_size" json:"tcg_cache_size"`       // MiB, without KVM
	SharedFS              string   `toml:"shared_fs" json:"shared_fs"`
	VirtioFSDaemon        string   `toml:"virtio_fs_daemon" json:"virtio_fs_daemon"`
	BlockDeviceDriver     string   `toml:"block_device_driver" json:"block_device_driver"`
	DisableBlockDeviceUse bool     `toml:"disable_block_device_use" json:"disable_block_device_use"`
	EnableDebug           bool     `toml:"enable_debug" json:"enable_debug"`
}

// Agent is the [agent] section.
type Agent struct {
	DialTimeout   int      `toml:"dial_timeout" json:"dial_timeout"` // seconds
	KernelModules []string `toml:"kernel_modules" json:"kernel_modules"`
	EnableDebug   bool     `toml:"enable_debug" json:"enable_debug"`
}

// Runtime is the [runtime] section.
type Runtime struct {
	InternetworkingModel   string   `toml:"internetworking_model" json:"internetworking_model"`
	DisableGuestSeccomp    bool     `toml:"disable_guest_seccomp" json:"disable_guest_seccomp"`
	SandboxCgroupOnly      bool     `toml:"sandbox_cgroup_only" json:"sandbox_cgroup_only"`
	CreateContainerTimeout int      `toml:"create_container_timeout" json:"create_container_timeout"` // seconds
	EnableDebug            bool     `toml:"enable_debug" json:"enable_debug"`
	Experimental           []string `toml:"experimental" json:"experimental"`
	PrivilegedHostDevices  bool     `toml:"privileged_host_devices" json:"privileged_host_devices"`
	// StateDir holds one directory per sandbox (its state, sockets,
	// console log, share); `hull ps` and `hull gc` read it.
	StateDir string `toml:"state_dir" json:"state_dir"`
}

// Allowed values of the enumerated keys; the first is the default.
var (
	MachineTypes          = []string{"q35", "pc", "microvm"}
	SharedFSTypes         = []string{"virtio-9p", "virtio-fs", "none"}
	BlockDeviceDrivers    = []string{"virtio-blk", "virtio-scsi"}
	InternetworkingModels = []string{"tcfilter", "macvtap", "none"}
	// ExperimentalFeatures lists the names runtime.experimental accepts.
	ExperimentalFeatures = []string{}
)

// Networking models.
const (
	NetTCFilter = "tcfilter"
	NetMacvtap  = "macvtap"
	NetNone     = "none"
)

// DialTimeoutDuration is agent.dial_timeout as a duration.
func (a Agent) DialTimeoutDuration() time.Duration {
	return time.Duration(a.DialTimeout) * time.Second
}

// CreateContainerTimeoutDuration is runtime.create_container_timeout as a duration.
func (r Runtime) CreateContainerTimeoutDuration() time.Duration {
	return time.Duration(r.CreateContainerTimeout) * time.Second
}

// UsesPATH reports whether Path is a command name to look up on PATH
// rather than a path.
func (h Hypervisor) UsesPATH() bool { return !strings.Contains(h.Path, "/") }

// Debug reports whether any section asks for debug output.
func (c *Config) Debug() bool {
	return c.Hypervisor.EnableDebug || c.Agent.EnableDebug || c.Runtime.EnableDebug
}
