package hostcheck

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/fsguard"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// Paths the probes read; variables so tests can point them elsewhere.
var (
	devVhostVsck = "/dev/vhost-vsock"
	devTun       = "/dev/net/tun"
	sysModule    = "/sys/module"
	sysCgroup    = "/sys/fs/cgroup"
	procConfig   = "/proc/config.gz"
)

const kvmFix = "enable hardware virtualisation (VT-x/AMD-V, or nested virtualisation when this host is itself a VM) " +
	"and load kvm_intel or kvm_amd; until then VMs run under TCG, several times slower"

// KVM reports whether KVM can run a standard guest kernel. It opens
// /dev/kvm, checks KVM_GET_API_VERSION and creates (and closes) a VM. Both
// also succeed under kvm_pvm (Linux running in a VM without nested
// virtualisation), which runs only PVM-enabled guests, so the vendor
// module decides: kvm_intel/kvm_amd is usable, a lone kvm_pvm is not.
func KVM() Result {
	res := Result{Name: "kvm"}
	detail, err := qemu.ProbeKVM()
	if err != nil {
		res.Detail = "unusable: " + err.Error() + "; TCG fallback (slow)"
		res.Fix = kvmFix
		return res
	}
	res.OK = true
	res.Detail = detail
	return res
}

// Vsock reports whether /dev/vhost-vsock can be opened.
func Vsock() Result {
	res := Result{Name: "vhost-vsock"}
	if err := openClose(devVhostVsck); err != nil {
		res.Detail = fmt.Sprintf("unavailable (%v); the agent channel uses virtio-serial instead", unwrapPath(err))
		res.Fix = "modprobe vhost_vsock"
		return res
	}
	res.OK = true
	res.Detail = devVhostVsck + " opens"
	return res
}

// Landlock reports whether the kernel has the Landlock ABI that walls
// each QEMU's files a second time (internal/fsguard); without it QEMU
// still runs, in its own root, as its own user, with its capabilities
// and filter.
func Landlock() Result {
	res := Result{Name: "landlock"}
	abi := fsguard.LandlockABI()
	if abi < fsguard.MinLandlockABI {
		res.Detail = fmt.Sprintf("ABI %d (need %d): QEMU's own root, user and filters confine it, without Landlock's second wall around its files", abi, fsguard.MinLandlockABI)
		res.Fix = "a kernel ≥ 5.19 with CONFIG_SECURITY_LANDLOCK=y and landlock in its lsm= list (e.g. lsm=landlock,lockdown,yama,apparmor,bpf)"
		return res
	}
	res.OK = true
	res.Detail = fmt.Sprintf("ABI %d: a second wall around each QEMU's files", abi)
	if abi >= 4 {
		res.Detail += ", no TCP"
	}
	if abi >= 6 {
		res.Detail += ", no signal out of its domain"
	}
	return res
}

// Templates reports whether pod VMs are restored from templates: on in
// the configuration, and a kernel that can give a clone's QEMU its
// template's memory read-only (fsguard.ReadOnlyOpens).
func Templates(enabled bool) Result {
	res := Result{Name: "templates"}
	if !enabled {
		res.OK = true
		res.Detail = "off (factory.enable_template = false): every pod's VM boots"
		return res
	}
	if err := fsguard.ReadOnlyOpens(); err != nil {
		res.Detail = fmt.Sprintf("%v: every pod's VM boots", err)
		res.Fix = "a kernel ≥ 5.9, or factory.enable_template = false to say so"
		return res
	}
	res.OK = true
	res.Detail = "on: pod VMs restored from a template, its memory read-only to each clone's QEMU"
	return res
}

// Tap reports whether /dev/net/tun opens, which creating tap devices needs.
func Tap() Result {
	res := Result{Name: "tap"}
	if err := openClose(devTun); err != nil {
		res.Detail = fmt.Sprintf("%s: %v", devTun, unwrapPath(err))
		res.Fix = "modprobe tun; if /dev/net/tun is still missing: mkdir -p /dev/net && mknod /dev/net/tun c 10 200"
		return res
	}
	res.OK = true
	res.Detail = devTun + " opens"
	return res
}

func openClose(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// unwrapPath drops the "open PATH: " of a *PathError whose path the
// caller already names.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// kernelFeature is one kernel module (or built-in) a feature needs.
type kernelFeature struct {
	module string // as in /sys/module and modprobe
	config string // its Kconfig symbol
}

// TC reports whether the kernel has the tc pieces the tcfilter network
// model uses: the ingress qdisc, the u32 classifier and the mirred action.
func TC() Result {
	return featureResult("tc", []kernelFeature{
		{"sch_ingress", "CONFIG_NET_SCH_INGRESS"},
		{"cls_u32", "CONFIG_NET_CLS_U32"},
		{"act_mirred", "CONFIG_NET_ACT_MIRRED"},
	})
}

// Macvtap reports whether the kernel has macvtap, which the macvtap
// network model uses. It does not create a device.
func Macvtap() Result {
	return featureResult("macvtap", []kernelFeature{{"macvtap", "CONFIG_MACVTAP"}})
}

func featureResult(name string, fs []kernelFeature) Result {
	res := Result{Name: name, OK: true}
	kconfig := readKernelConfig()
	var parts, missing []string
	for _, f := range fs {
		state := featureState(f, kconfig)
		if state == "missing" {
			res.OK = false
			missing = append(missing, f.module)
		}
		parts = append(parts, f.module+": "+state)
	}
	res.Detail = strings.Join(parts, ", ")
	if !res.OK {
		res.Fix = "modprobe " + strings.Join(missing, " ") + " (or use a kernel built with them)"
	}
	return res
}

// featureState says how the kernel provides f: "loaded", "built in",
// "module" (loadable on demand), "missing", or "unknown" when neither
// /sys/module nor the kernel configuration tells.
func featureState(f kernelFeature, kconfig map[string]string) string {
	if moduleLoaded(f.module) {
		return "loaded"
	}
	if kconfig == nil {
		return "unknown (not loaded; no kernel config to tell whether built in)"
	}
	switch kconfig[f.config] {
	case "y":
		return "built in"
	case "m":
		return "module"
	default:
		return "missing"
	}
}

func moduleLoaded(name string) bool {
	_, err := os.Stat(sysModule + "/" + name)
	return err == nil
}

// readKernelConfig reads /proc/config.gz or /boot/config-$(uname -r), or
// returns nil.
func readKernelConfig() map[string]string {
	var r io.Reader
	if f, err := os.Open(procConfig); err == nil {
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil
		}
		r = zr
	} else {
		var u unix.Utsname
		if unix.Uname(&u) != nil {
			return nil
		}
		f, err := os.Open("/boot/config-" + unix.ByteSliceToString(u.Release[:]))
		if err != nil {
			return nil
		}
		defer f.Close()
		r = f
	}
	cfg := map[string]string{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			cfg[k] = v
		}
	}
	if sc.Err() != nil {
		return nil
	}
	return cfg
}

// Cgroup reports the cgroup version mounted at /sys/fs/cgroup: "v2",
// "hybrid" (v1 with cgroup2 at /sys/fs/cgroup/unified) or "v1".
func Cgroup() (string, Result) {
	res := Result{Name: "cgroup", OK: true}
	var st unix.Statfs_t
	if err := unix.Statfs(sysCgroup, &st); err != nil {
		res.OK = false
		res.Detail = fmt.Sprintf("statfs %s: %v", sysCgroup, err)
		res.Fix = "mount cgroup2 on /sys/fs/cgroup"
		return "", res
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		res.Detail = "v2 (unified hierarchy at " + sysCgroup + ")"
		return "v2", res
	}
	var ust unix.Statfs_t
	if unix.Statfs(sysCgroup+"/unified", &ust) == nil && ust.Type == unix.CGROUP2_SUPER_MAGIC {
		res.Detail = "hybrid: v1 controllers, cgroup2 at " + sysCgroup + "/unified"
		return "hybrid", res
	}
	res.Detail = "v1"
	return "v1", res
}
