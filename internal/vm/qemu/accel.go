package qemu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ioctl numbers from <linux/kvm.h>.
const (
	kvmGetAPIVersion = 0xAE00
	kvmCreateVM      = 0xAE01
	kvmAPIVersion    = 12
)

// ProbeKVM reports whether KVM can run a standard guest kernel here: what
// it found when it can, an error saying why when it cannot.
//
// Opening /dev/kvm and creating a VM are not enough: under a PVM host
// (the kvm_pvm module, used when Linux itself runs in a VM without
// nested virtualisation) both work and even real-mode code runs, but a
// standard kernel hangs early in boot. So the probe also names the
// vendor module: kvm_intel or kvm_amd is hardware virtualisation, a lone
// kvm_pvm runs only PVM-enabled guests.
func ProbeKVM() (string, error) {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("opening /dev/kvm: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return "", fmt.Errorf("KVM_GET_API_VERSION: %w", err)
	}
	if v != kvmAPIVersion {
		return "", fmt.Errorf("KVM_GET_API_VERSION: %d, want %d", v, kvmAPIVersion)
	}
	vmfd, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return "", fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	unix.Close(vmfd)
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if moduleLoaded(m) {
			return "usable (" + m + ", API version 12)", nil
		}
	}
	if moduleLoaded("kvm_pvm") {
		return "", errors.New("kvm is provided by kvm_pvm, which runs only PVM-enabled guest kernels")
	}
	// No way to tell: trust KVM_CREATE_VM.
	return "usable (API version 12, KVM_CREATE_VM works; vendor module not identified)", nil
}

func moduleLoaded(name string) bool {
	_, err := os.Stat("/sys/module/" + name)
	return err == nil
}

// kvmUsable caches the probe: it does not change while we run.
var kvmUsable = sync.OnceValue(func() error { _, err := ProbeKVM(); return err })

// AccelFallback says why accel ("auto", "kvm" or "tcg") runs under TCG
// although KVM was wanted ("auto" on a host whose KVM is unusable), ""
// when it does not.
func AccelFallback(accel string) string {
	_, why := resolveAccel(accel)
	return why
}

// resolveAccel turns a config's accel into AccelKVM or AccelTCG. why is
// non-empty when "auto" fell back to TCG.
func resolveAccel(accel string) (resolved, why string) {
	switch accel {
	case AccelKVM, AccelTCG:
		return accel, ""
	}
	if err := kvmUsable(); err != nil {
		return AccelTCG, "kvm unusable: " + err.Error() + "; using TCG (slow)"
	}
	return AccelKVM, ""
}

// hostTSCkHz returns the host's TSC frequency where it can be known
// without measuring. Under TCG the guest reads the host's TSC, and under
// KVM the guest TSC runs at the host's rate by default, so the value is
// the guest's too.
var hostTSCkHz = sync.OnceValues(func() (int, bool) {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if khz, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && khz > 0 {
			return khz, true
		}
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	return parseCPUInfoTSC(f)
})

// parseCPUInfoTSC reads the first processor block of /proc/cpuinfo. The
// TSC rate is known only for an invariant TSC (constant_tsc and
// nonstop_tsc), either from Intel's nominal "@ x.xxGHz" in the model name
// or, in a VM whose hypervisor reports it (tsc_known_freq, hypervisor),
// from "cpu MHz", which is then tsc_khz (there is no frequency scaling).
func parseCPUInfoTSC(f *os.File) (int, bool) {
	var model, mhz string
	var flags map[string]bool
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			break
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "model name":
			model = v
		case "cpu MHz":
			mhz = v
		case "flags":
			flags = map[string]bool{}
			for _, fl := range strings.Fields(v) {
				flags[fl] = true
			}
		}
	}
	if !flags["constant_tsc"] || !flags["nonstop_tsc"] {
		return 0, false
	}
	if _, ghz, ok := strings.Cut(model, "@ "); ok && strings.HasSuffix(ghz, "GHz") {
		if g, err := strconv.ParseFloat(strings.TrimSuffix(ghz, "GHz"), 64); err == nil && g > 0 {
			return int(g*1e6 + 0.5), true
		}
	}
	if flags["hypervisor"] && flags["tsc_known_freq"] {
		if m, err := strconv.ParseFloat(mhz, 64); err == nil && m > 0 {
			return int(m*1e3 + 0.5), true
		}
	}
	return 0, false
}
