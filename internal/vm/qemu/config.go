package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hull-runtime/hull/internal/vm"
)

// Machine types Hull supports.
const (
	MachineQ35     = "q35"
	MachinePC      = "pc"
	MachineMicrovm = "microvm"
)

// Machines lists the machine types New accepts.
var Machines = []string{MachineQ35, MachinePC, MachineMicrovm}

// Accelerators as passed to BuildArgs.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// QbootPath is the firmware used by default for q35 when it exists: it
// boots a -kernel far faster than SeaBIOS (docs/boot.md).
const QbootPath = "/usr/share/qemu/qboot.rom"

// The QEMUs an empty Binary chooses between (docs/qemu.md): Hull's own
// build (hack/build-qemu.sh), and the distribution's.
const (
	HullBinary   = "qemu-system-x86_64-hull"
	DistroBinary = "qemu-system-x86_64"
)

// DefaultBinary is the QEMU an empty Binary (hypervisor.qemu.path = "")
// runs: Hull's own when it is on PATH, else the distribution's.
func DefaultBinary() string {
	if _, err := exec.LookPath(HullBinary); err == nil {
		return HullBinary
	}
	return DistroBinary
}

const (
	minMemoryMiB = 64
	maxMemoryMiB = 1 << 20 // 1 TiB
	maxVCPUs     = 255
	// unixPathMax is sizeof(sockaddr_un.sun_path) minus the NUL.
	unixPathMax = 107
)

var (
	tagRE   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,31}$`)
	nicIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,31}$`)
)

// validate checks cfg and returns it with defaults filled in. It names
// the offending value or path in every error.
func validate(cfg vm.Config) (vm.Config, error) {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	if cfg.ID == "" {
		bad("id is empty")
	}
	if cfg.Dir == "" {
		bad("dir is empty")
	} else if fi, err := os.Stat(cfg.Dir); err != nil {
		bad("dir: %w", err)
	} else if !fi.IsDir() {
		bad("dir %s is not a directory", cfg.Dir)
	} else if p := filepath.Join(cfg.Dir, agentSockName); len(p) > unixPathMax {
		bad("dir %s is too long for a unix socket path (%d > %d bytes)", cfg.Dir, len(p), unixPathMax)
	}

	if cfg.Binary == "" {
		cfg.Binary = DefaultBinary()
	}
	if p, err := exec.LookPath(cfg.Binary); err != nil {
		bad("qemu binary: %w", err)
	} else {
		cfg.Binary = p
	}

	if cfg.MachineType == "" {
		cfg.MachineType = MachineQ35
	}
	if !slices.Contains(Machines, cfg.MachineType) {
		bad("machine type %q is not one of %s", cfg.MachineType, strings.Join(Machines, ", "))
	}
	if cfg.Firmware == "" && cfg.MachineType == MachineQ35 {
		if _, err := os.Stat(QbootPath); err == nil {
			cfg.Firmware = QbootPath
		}
	}
	if cfg.Firmware != "" {
		if err := regularFile(cfg.Firmware); err != nil {
			bad("firmware: %w", err)
		}
	}

	if cfg.VCPUs < 1 || cfg.VCPUs > maxVCPUs {
		bad("vcpus %d out of range [1, %d]", cfg.VCPUs, maxVCPUs)
	}
	if cfg.MemoryMiB < minMemoryMiB || cfg.MemoryMiB > maxMemoryMiB {
		bad("memory %d MiB out of range [%d, %d]", cfg.MemoryMiB, minMemoryMiB, maxMemoryMiB)
	}
	if cfg.Kernel == "" {
		bad("kernel is empty")
	} else if err := regularFile(cfg.Kernel); err != nil {
		bad("kernel: %w", err)
	}
	if cfg.Initrd != "" {
		if err := regularFile(cfg.Initrd); err != nil {
			bad("initrd: %w", err)
		}
	}
	for _, p := range cfg.KernelParams {
		if p == "" || strings.ContainsAny(p, " \t\n\"") {
			bad("kernel parameter %q is empty or holds whitespace or quotes", p)
		}
	}

	switch cfg.Accel {
	case "":
		cfg.Accel = "auto"
	case "auto", AccelKVM, AccelTCG:
	default:
		bad("accel %q is not one of auto, kvm, tcg", cfg.Accel)
	}

	tags := map[string]bool{}
	for _, s := range cfg.Shares {
		if !tagRE.MatchString(s.Tag) {
			bad("share tag %q must be 1-31 characters of [A-Za-z0-9._-]", s.Tag)
		} else if tags[s.Tag] {
			bad("share tag %q used twice", s.Tag)
		}
		tags[s.Tag] = true
		if fi, err := os.Stat(s.HostPath); err != nil {
			bad("share %s: %w", s.Tag, err)
		} else if !fi.IsDir() {
			bad("share %s: %s is not a directory", s.Tag, s.HostPath)
		}
	}

	ids := map[string]bool{}
	for i, n := range cfg.NICs {
		if !nicIDRE.MatchString(n.ID) {
			bad("nic %d: id %q must be 1-31 characters of [A-Za-z0-9_-]", i, n.ID)
		} else if ids[n.ID] {
			bad("nic id %q used twice", n.ID)
		}
		ids[n.ID] = true
		if len(n.MAC) != 6 || n.MAC[0]&1 != 0 {
			bad("nic %s: MAC %q is not a unicast Ethernet address", n.ID, n.MAC)
		}
		building := cfg.Memory != nil && cfg.Memory.Shared
		if n.TapFile == nil && !building {
			bad("nic %s: no tap file", n.ID)
		}
	}
	if cfg.Memory != nil {
		validateMemory(cfg, bad)
	} else if cfg.Restore != nil {
		bad("restore: a saved state needs its memory file")
	}

	if len(errs) > 0 {
		return cfg, fmt.Errorf("invalid vm config: %w", errors.Join(errs...))
	}

	// A clock hint that keeps boots under TCG from hanging (microvm)
	// and skips calibration; the caller's own value wins.
	if khz, ok := hostTSCkHz(); ok && !hasParam(cfg.KernelParams, "tsc_early_khz") {
		cfg.KernelParams = append([]string{"tsc_early_khz=" + strconv.Itoa(khz)}, cfg.KernelParams...)
	}
	return cfg, nil
}

func regularFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// hasParam reports whether params set key (as "key" or "key=value").
func hasParam(params []string, key string) bool {
	for _, p := range params {
		if k, _, _ := strings.Cut(p, "="); k == key {
			return true
		}
	}
	return false
}
