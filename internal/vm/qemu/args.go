package qemu

import (
	"strconv"
	"strings"

	"github.com/hull-runtime/hull/internal/vm"
)

// File names inside vm.Config.Dir.
const (
	qmpSockName   = "qmp.sock"
	agentSockName = "agent.sock"
	consoleName   = "console.log"
	qemuLogName   = "qemu.log"
	// rootName is the empty directory QEMU's own root is built on
	// (fsguard.Policy.Root): on the host it stays empty.
	rootName = "qemu-root"
)

// AgentPortName is the virtio-serial port name the guest agent looks
// for (/dev/virtio-ports/hull.agent).
const AgentPortName = "hull.agent"

// TCGCacheMiB is the default bound of TCG's translation cache
// (hypervisor.qemu.tcg_cache_size). QEMU's default (1 GiB of address
// space, filled as code is translated) is most of a guest's RSS; the
// cache's pages are touched only as code is translated, so a bound costs
// what the guest's code fills of it. Sized by measurement
// (docs/performance.md, "tb-size, by measurement").
const TCGCacheMiB = 48

// tcgCPU is the CPU model under TCG: the x86-64-v2 baseline (RHEL 9 and
// other images refuse to run without it) plus arat, so that idle guests
// do not keep a periodic tick running.
const tcgCPU = "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+arat"

// baseKernelParams are always passed, before the caller's parameters (a
// later parameter overrides an earlier one).
var baseKernelParams = []string{
	"console=ttyS0", "quiet", "panic=1", "no_timer_check", "cryptomgr.notests",
	// Reboot by triple fault: -no-reboot turns it into an exit at once.
	"reboot=t",
	// The TSC of a QEMU guest is steady (TCG derives it from the host's
	// clock; under KVM the guest reads kvm-clock): without this the guest
	// checks it against the HPET twice a second, or on microvm falls back
	// to a jiffies clock ticking at 250 Hz. An idle q35 guest's QEMU used
	// 120–150 ms of CPU in 30 s without it, 100 ms with it
	// (docs/performance.md). Kata passes it too.
	"tsc=reliable",
	// No proactive compaction: kcompactd woke every 500 ms to score the
	// guest's fragmentation (for huge pages, which Hull's kernel does not
	// use), two of an idle guest's five timer interrupts a second; each
	// costs its QEMU CPU under TCG (docs/performance.md). Compaction on
	// demand stays.
	"sysctl.vm.compaction_proactiveness=0",
}

// kernelParamsWhere are the parameters passed only where they apply,
// after baseKernelParams and before the caller's parameters.
var kernelParamsWhere = []struct {
	param string
	where func(cfg vm.Config, accel string) bool
}{
	// No PCIe port services (AER, PME, native hotplug) on the root
	// ports: QEMU's q35 hotplugs through ACPI (disk.go), and probing the
	// services of the eight ports took ≈ 20 ms of every boot under TCG
	// (docs/performance.md). The ports stay bridges.
	{"pcie_ports=compat", func(cfg vm.Config, _ string) bool { return cfg.MachineType == MachineQ35 }},
	// No local APIC timer: its calibration against the PIT takes 100 ms
	// of every boot (a tenth of a second of ticks, and longer under TCG),
	// and TCG's CPU has no TSC-deadline timer, which would skip it. The
	// HPET drives the one CPU's timer instead (docs/performance.md). Not
	// on KVM, whose guests have a TSC-deadline timer and for whom the HPET
	// is an exit to QEMU; not with several vCPUs, where the HPET would
	// wake the others by IPI; not on microvm, which has no HPET.
	{"noapictimer", func(cfg vm.Config, accel string) bool {
		return oneVCPUUnderTCG(cfg, accel) && cfg.MachineType != MachineMicrovm
	}},
	// The kernel's LOCK prefixes left as they are: a kernel that finds
	// one CPU rewrites each of them to a NOP at boot, and under TCG a
	// write to code already translated invalidates it, one store at a
	// time; that took ≈ 55 ms of every boot (docs/performance.md). A
	// locked instruction costs a one-vCPU TCG guest nothing: QEMU emits
	// host atomics only while several vCPUs run in parallel.
	{"noreplace-smp", oneVCPUUnderTCG},
}

func oneVCPUUnderTCG(cfg vm.Config, accel string) bool {
	return accel == AccelTCG && cfg.VCPUs == 1
}

// esc quotes a value for QEMU's option syntax, where ',' separates keys.
func esc(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// KernelCmdline is the -append string for cfg under accel.
func KernelCmdline(cfg vm.Config, accel string) string {
	var p []string
	p = append(p, baseKernelParams...)
	for _, kp := range kernelParamsWhere {
		if kp.where(cfg, accel) {
			p = append(p, kp.param)
		}
	}
	p = append(p, cfg.KernelParams...)
	return strings.Join(p, " ")
}

// BuildArgs returns QEMU's command line (without the binary) for a
// validated cfg and a resolved accelerator (AccelKVM or AccelTCG). It
// reads nothing from the host.
func BuildArgs(cfg vm.Config, accel string) []string {
	mem := strconv.Itoa(cfg.MemoryMiB) + "M"
	micro := cfg.MachineType == MachineMicrovm
	// virtio transport: PCI on q35/pc (hotplug), MMIO on microvm.
	dev := func(kind string) string {
		if micro {
			return kind + "-device"
		}
		return kind + "-pci"
	}

	var machine string
	switch cfg.MachineType {
	case MachinePC:
		machine = "pc,smm=off,vmport=off,sata=off,usb=off"
	case MachineMicrovm:
		machine = "microvm,isa-serial=on,pit=off,pic=off,rtc=on"
	default:
		// No i8042 (its probe costs boot time), AHCI or USB; the
		// ACPI PCI hotplug of q35 stays.
		machine = "q35,smm=off,vmport=off,i8042=off,sata=off,usb=off"
	}

	a := []string{
		"-name", esc(cfg.ID) + ",debug-threads=on",
		"-machine", machine + ",memory-backend=ram0",
	}
	a = append(a, memoryArgs(cfg, mem)...)
	a = append(a, "-m", mem, "-smp", strconv.Itoa(cfg.VCPUs))
	if accel == AccelKVM {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		tb := cfg.TCGCacheMiB
		if tb <= 0 {
			tb = TCGCacheMiB
		}
		a = append(a, "-accel", "tcg,thread=multi,tb-size="+strconv.Itoa(tb), "-cpu", tcgCPU)
	}
	if cfg.Firmware != "" {
		a = append(a, "-bios", cfg.Firmware)
	}
	a = append(a, "-kernel", cfg.Kernel)
	if cfg.Initrd != "" {
		a = append(a, "-initrd", cfg.Initrd)
	}
	a = append(a, "-append", KernelCmdline(cfg, accel))
	a = append(a,
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-display", "none", "-vga", "none",
		// QMP
		// Both sockets are listening sockets Start makes and passes: QEMU
		// makes no socket (internal/fsguard refuses it).
		"-chardev", "socket,id=qmp,fd="+strconv.Itoa(qmpFD)+",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		// Guest console on ttyS0, to QEMU's stdout: a pipe the driver
		// copies to the console log and to ConsoleOutput.
		"-chardev", "stdio,id=console,signal=off",
		"-serial", "chardev:console",
		// Agent channel: a virtio-serial port backed by a host socket.
		"-device", dev("virtio-serial")+",id=vser0",
		"-chardev", "socket,id=agent,fd="+strconv.Itoa(agentFD)+",server=on,wait=off",
		"-device", "virtserialport,id="+agentPortID+",bus=vser0.0,chardev=agent,name="+AgentPortName,
		// Guest entropy.
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", dev("virtio-rng")+",rng=rng0",
	)
	// Memory the guest frees goes back to the host: the guest reports free
	// blocks (CONFIG_PAGE_REPORTING) and QEMU discards them. In a clone
	// QEMU 7.2 first punches a hole in its memory file, the template
	// every clone maps: that punch succeeds without effect (its
	// descriptor is read-only, internal/fsguard reopen.go), and QEMU
	// then drops its own copy of the pages (docs/templates.md).
	a = append(a, "-device", dev("virtio-balloon")+",free-page-reporting=on")
	a = append(a, hotplugArgs(cfg)...)
	for i, s := range cfg.Shares {
		id := "fs" + strconv.Itoa(i)
		// passthrough: guest root's chown/chmod/mknod act on the host
		// files for real (QEMU runs as root), and failures are reported
		// rather than ignored as with "none". multidevs=remap keeps inode
		// numbers unique when the share spans several host filesystems
		// (a rootfs with bind mounts under it).
		fsdev := "local,id=" + id + ",path=" + esc(s.HostPath) + ",security_model=passthrough,multidevs=remap"
		if s.ReadOnly {
			fsdev += ",readonly=on"
		}
		a = append(a,
			"-fsdev", fsdev,
			"-device", dev("virtio-9p")+",id="+id+"dev,fsdev="+id+",mount_tag="+s.Tag,
		)
	}
	fd := NICFirstFD
	for _, n := range cfg.NICs {
		if n.TapFile == nil {
			// A template's card: no backend until a clone gives it one.
			a = append(a, "-device", dev("virtio-net")+",mac="+n.MAC.String()+nicOpts(micro))
			continue
		}
		// The tap descriptors are the child's fds NICFirstFD, ... (Start
		// passes them in this order as ExtraFiles). vhost-net is off: the host may
		// not have it, and under TCG it gains nothing.
		a = append(a,
			"-netdev", "tap,id="+n.ID+",fd="+strconv.Itoa(fd)+",vhost=off",
			"-device", dev("virtio-net")+",netdev="+n.ID+",mac="+n.MAC.String()+nicOpts(micro),
		)
		fd++
	}
	a = append(a, restoreArgs(cfg)...)
	return append(a, "-sandbox", SandboxOpt)
}

// SandboxOpt is QEMU's seccomp filter: besides the default deny list,
// no obsolete system calls, no set*uid/gid or capability changes, no
// fork/exec and no scheduler, affinity or priority changes.
const SandboxOpt = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// The descriptors QEMU inherits (Start's ExtraFiles, in this order): its
// QMP and agent sockets, listening; the NICs' taps from NICFirstFD on;
// then a restore's device state (restoreFD).
const (
	qmpFD   = 3
	agentFD = 4
	// NICFirstFD is the descriptor number QEMU sees the first NIC's tap at.
	NICFirstFD = 5
)

// nicOpts are the virtio-net options: one queue pair, and on PCI no
// option ROM (only firmware network boot would use it; it costs boot time).
func nicOpts(micro bool) string {
	if micro {
		return ",mq=off"
	}
	return ",mq=off,romfile="
}
