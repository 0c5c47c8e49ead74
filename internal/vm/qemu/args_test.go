package qemu

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/vm"
)

func baseConfig() vm.Config {
	return vm.Config{
		ID: "pod1", Dir: "/run/hull/pod1", Binary: "/usr/bin/qemu-system-x86_64",
		MachineType: "q35", Firmware: QbootPath, VCPUs: 2, MemoryMiB: 128,
		Kernel: "/usr/share/hull/vmlinux", Initrd: "/usr/share/hull/initrd.img",
		KernelParams: []string{"tsc_early_khz=2600000"}, Accel: "auto",
	}
}

func TestBuildArgsQ35TCG(t *testing.T) {
	cfg := baseConfig()
	cfg.Shares = []vm.Share{
		{Tag: "rootfs", HostPath: "/run/hull/pod1/shared"},
		{Tag: "vol", HostPath: "/data/a,b", ReadOnly: true},
	}
	cfg.NICs = []vm.NIC{
		{ID: "net0", MAC: net.HardwareAddr{0x02, 0x42, 0x0a, 0x58, 0, 5}, TapFile: os.Stdin},
		{ID: "net1", MAC: net.HardwareAddr{0x02, 0x42, 0x0a, 0x58, 0, 6}, TapFile: os.Stdin},
	}
	want := []string{
		"-name", "pod1,debug-threads=on",
		"-machine", "q35,smm=off,vmport=off,i8042=off,sata=off,usb=off,memory-backend=ram0",
		"-object", "memory-backend-ram,id=ram0,size=128M",
		"-m", "128M",
		"-smp", "2",
		"-accel", "tcg,thread=multi,tb-size=48",
		"-cpu", "qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+arat",
		"-bios", "/usr/share/qemu/qboot.rom",
		"-kernel", "/usr/share/hull/vmlinux",
		"-initrd", "/usr/share/hull/initrd.img",
		"-append", "console=ttyS0 quiet panic=1 no_timer_check cryptomgr.notests reboot=t tsc=reliable sysctl.vm.compaction_proactiveness=0 pcie_ports=compat tsc_early_khz=2600000",
		"-nodefaults", "-no-user-config", "-no-reboot",
		"-display", "none", "-vga", "none",
		"-chardev", "socket,id=qmp,fd=3,server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "stdio,id=console,signal=off",
		"-serial", "chardev:console",
		"-device", "virtio-serial-pci,id=vser0",
		"-chardev", "socket,id=agent,fd=4,server=on,wait=off",
		"-device", "virtserialport,id=agentport,bus=vser0.0,chardev=agent,name=hull.agent",
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-pci,rng=rng0",
		"-device", "virtio-balloon-pci,free-page-reporting=on",
		"-device", "pcie-root-port,id=rp0,bus=pcie.0,chassis=1,addr=10.0,multifunction=on",
		"-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=2,addr=10.1",
		"-device", "pcie-root-port,id=rp2,bus=pcie.0,chassis=3,addr=10.2",
		"-device", "pcie-root-port,id=rp3,bus=pcie.0,chassis=4,addr=10.3",
		"-device", "pcie-root-port,id=rp4,bus=pcie.0,chassis=5,addr=10.4",
		"-device", "pcie-root-port,id=rp5,bus=pcie.0,chassis=6,addr=10.5",
		"-device", "pcie-root-port,id=rp6,bus=pcie.0,chassis=7,addr=10.6",
		"-device", "pcie-root-port,id=rp7,bus=pcie.0,chassis=8,addr=10.7",
		"-fsdev", "local,id=fs0,path=/run/hull/pod1/shared,security_model=passthrough,multidevs=remap",
		"-device", "virtio-9p-pci,id=fs0dev,fsdev=fs0,mount_tag=rootfs",
		"-fsdev", "local,id=fs1,path=/data/a,,b,security_model=passthrough,multidevs=remap,readonly=on",
		"-device", "virtio-9p-pci,id=fs1dev,fsdev=fs1,mount_tag=vol",
		"-netdev", "tap,id=net0,fd=5,vhost=off",
		"-device", "virtio-net-pci,netdev=net0,mac=02:42:0a:58:00:05,mq=off,romfile=",
		"-netdev", "tap,id=net1,fd=6,vhost=off",
		"-device", "virtio-net-pci,netdev=net1,mac=02:42:0a:58:00:06,mq=off,romfile=",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
	}
	got := BuildArgs(cfg, AccelTCG)
	if !slices.Equal(got, want) {
		t.Errorf("BuildArgs:\n got %q\nwant %q", got, want)
	}
}

// The driver's default cache (callers that give none: a template's
// build) is the configuration's default, tcg_cache_size.
func TestTCGCacheDefaultIsTheConfigs(t *testing.T) {
	if d := config.Defaults().Hypervisor.TCGCacheSize; d != TCGCacheMiB {
		t.Errorf("hypervisor.qemu.tcg_cache_size defaults to %d MiB, the QEMU driver to %d", d, TCGCacheMiB)
	}
}

// hypervisor.qemu.tcg_cache_size reaches QEMU's tb-size, under TCG only.
func TestBuildArgsTCGCacheSize(t *testing.T) {
	cfg := baseConfig()
	cfg.TCGCacheMiB = 40
	if got := BuildArgs(cfg, AccelTCG); !slices.Contains(got, "tcg,thread=multi,tb-size=40") {
		t.Errorf("TCG with a 40 MiB cache: %q", got)
	}
	if got := BuildArgs(cfg, AccelKVM); slices.ContainsFunc(got, func(a string) bool { return strings.Contains(a, "tb-size") }) {
		t.Errorf("KVM with a TCG cache size: %q", got)
	}
}

func TestBuildArgsMachines(t *testing.T) {
	for _, tc := range []struct {
		machine, accel string
		want           [][2]string // option, value pairs that must appear
		cmdline        string
	}{
		{MachinePC, AccelKVM, [][2]string{
			{"-machine", "pc,smm=off,vmport=off,sata=off,usb=off,memory-backend=ram0"},
			{"-accel", "kvm"}, {"-cpu", "host"}, {"-device", "virtio-serial-pci,id=vser0"},
			{"-sandbox", SandboxOpt},
		}, "console=ttyS0 quiet panic=1 no_timer_check cryptomgr.notests reboot=t tsc=reliable sysctl.vm.compaction_proactiveness=0"},
		{MachineMicrovm, AccelTCG, [][2]string{
			{"-machine", "microvm,isa-serial=on,pit=off,pic=off,rtc=on,memory-backend=ram0"},
			{"-device", "virtio-serial-device,id=vser0"}, {"-device", "virtio-rng-device,rng=rng0"},
			{"-device", "virtio-balloon-device,free-page-reporting=on"},
			{"-netdev", "tap,id=net0,fd=5,vhost=off"}, {"-device", "virtio-net-device,netdev=net0,mac=02:00:00:00:00:01,mq=off"},
		}, "console=ttyS0 quiet panic=1 no_timer_check cryptomgr.notests reboot=t tsc=reliable sysctl.vm.compaction_proactiveness=0"},
	} {
		t.Run(tc.machine, func(t *testing.T) {
			cfg := baseConfig()
			cfg.MachineType, cfg.Firmware, cfg.KernelParams = tc.machine, "", nil
			cfg.NICs = []vm.NIC{{ID: "net0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, TapFile: os.Stdin}}
			got := BuildArgs(cfg, tc.accel)
			for _, p := range tc.want {
				if !hasPair(got, p[0], p[1]) {
					t.Errorf("missing %s %s in %q", p[0], p[1], got)
				}
			}
			if !hasPair(got, "-append", tc.cmdline) {
				t.Errorf("want -append %q in %q", tc.cmdline, got)
			}
			if slices.Contains(got, "-bios") {
				t.Errorf("-bios without firmware: %q", got)
			}
		})
	}
}

func hasPair(args []string, opt, val string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == opt && args[i+1] == val {
			return true
		}
	}
	return false
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	initrd := filepath.Join(dir, "initrd")
	for _, f := range []string{kernel, initrd} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	longDir := filepath.Join(dir, strings.Repeat("d", 120))
	if err := os.Mkdir(longDir, 0o755); err != nil {
		t.Fatal(err)
	}
	good := func() vm.Config {
		return vm.Config{ID: "t", Dir: dir, VCPUs: 1, MemoryMiB: 128, Kernel: kernel, Initrd: initrd,
			Binary: "/bin/true"}
	}
	cfg, err := validate(good())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MachineType != "q35" || cfg.Accel != "auto" {
		t.Errorf("defaults not filled in: %+v", cfg)
	}
	if _, err := os.Stat(QbootPath); err == nil && cfg.Firmware != QbootPath {
		t.Errorf("q35 firmware %q, want %s", cfg.Firmware, QbootPath)
	}

	for _, tc := range []struct {
		name   string
		mutate func(*vm.Config)
		want   []string // substrings of the error
	}{
		{"missing kernel", func(c *vm.Config) { c.Kernel = "/nonexistent/vmlinuz" }, []string{"kernel", "/nonexistent/vmlinuz"}},
		{"missing initrd", func(c *vm.Config) { c.Initrd = "/nonexistent/initrd" }, []string{"initrd", "/nonexistent/initrd"}},
		{"kernel is a dir", func(c *vm.Config) { c.Kernel = dir }, []string{dir, "not a regular file"}},
		{"zero vcpus", func(c *vm.Config) { c.VCPUs = 0 }, []string{"vcpus 0"}},
		{"small memory", func(c *vm.Config) { c.MemoryMiB = 32 }, []string{"memory 32 MiB"}},
		{"unknown machine", func(c *vm.Config) { c.MachineType = "virt" }, []string{`"virt"`, "q35, pc, microvm"}},
		{"bad accel", func(c *vm.Config) { c.Accel = "hvf" }, []string{`"hvf"`}},
		{"missing binary", func(c *vm.Config) { c.Binary = "/nonexistent/qemu" }, []string{"/nonexistent/qemu"}},
		{"missing dir", func(c *vm.Config) { c.Dir = "/nonexistent/dir" }, []string{"/nonexistent/dir"}},
		{"long dir", func(c *vm.Config) { c.Dir = longDir }, []string{"too long"}},
		{"bad param", func(c *vm.Config) { c.KernelParams = []string{"a b"} }, []string{`"a b"`}},
		{"missing share", func(c *vm.Config) { c.Shares = []vm.Share{{Tag: "x", HostPath: "/nonexistent/share"}} }, []string{"/nonexistent/share"}},
		{"bad tag", func(c *vm.Config) { c.Shares = []vm.Share{{Tag: "a,b", HostPath: dir}} }, []string{`"a,b"`}},
		{"nic without tap", func(c *vm.Config) { c.NICs = []vm.NIC{{ID: "net0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}} }, []string{"nic net0", "no tap file"}},
		{"nic multicast mac", func(c *vm.Config) {
			c.NICs = []vm.NIC{{ID: "net0", MAC: net.HardwareAddr{1, 0, 0, 0, 0, 1}, TapFile: os.Stdin}}
		}, []string{"nic net0", "01:00:00:00:00:01"}},
		{"nic bad id", func(c *vm.Config) {
			c.NICs = []vm.NIC{{ID: "a,b", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, TapFile: os.Stdin}}
		}, []string{`"a,b"`}},
		{"nic id twice", func(c *vm.Config) {
			n := vm.NIC{ID: "net0", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, TapFile: os.Stdin}
			c.NICs = []vm.NIC{n, n}
		}, []string{`"net0" used twice`}},
		{"missing firmware", func(c *vm.Config) { c.Firmware = "/nonexistent/fw.rom" }, []string{"/nonexistent/fw.rom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good()
			tc.mutate(&cfg)
			_, err := New(cfg, nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// An empty Binary runs Hull's own QEMU when it is on PATH, else the
// distribution's (docs/qemu.md), resolved to the path found.
func TestEmptyBinaryPrefersHullsQEMU(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	hullDir, distroDir := filepath.Join(dir, "hull"), filepath.Join(dir, "distro")
	for _, f := range []string{kernel, filepath.Join(hullDir, HullBinary), filepath.Join(distroDir, DistroBinary)} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := vm.Config{ID: "t", Dir: dir, VCPUs: 1, MemoryMiB: 128, Kernel: kernel}
	for _, tc := range []struct{ path, want string }{
		{hullDir + ":" + distroDir, filepath.Join(hullDir, HullBinary)},
		{distroDir + ":" + hullDir, filepath.Join(hullDir, HullBinary)},
		{distroDir, filepath.Join(distroDir, DistroBinary)},
	} {
		t.Setenv("PATH", tc.path)
		got, err := validate(cfg)
		if err != nil {
			t.Fatalf("PATH=%s: %v", tc.path, err)
		}
		if got.Binary != tc.want {
			t.Errorf("PATH=%s: binary %s, want %s", tc.path, got.Binary, tc.want)
		}
	}
	t.Setenv("PATH", dir)
	if _, err := validate(cfg); err == nil || !strings.Contains(err.Error(), DistroBinary) {
		t.Errorf("neither QEMU on PATH: error %v, want one naming %s", err, DistroBinary)
	}
}

func TestParseCPUInfoTSC(t *testing.T) {
	for _, tc := range []struct {
		text string
		khz  int
		ok   bool
	}{
		{"model name\t: Intel(R) Xeon(R) Processor\ncpu MHz\t\t: 2600.000\nflags\t\t: fpu constant_tsc nonstop_tsc tsc_known_freq hypervisor\n\n", 2600000, true},
		{"model name\t: Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz\ncpu MHz\t\t: 3400.012\nflags\t\t: fpu constant_tsc nonstop_tsc\n\n", 1900000, true},
		{"model name\t: AMD EPYC\ncpu MHz\t\t: 3400.012\nflags\t\t: fpu constant_tsc nonstop_tsc\n\n", 0, false},
		{"model name\t: old\ncpu MHz\t\t: 1000\nflags\t\t: fpu hypervisor tsc_known_freq\n\n", 0, false},
	} {
		f, err := os.CreateTemp(t.TempDir(), "cpuinfo")
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(tc.text)
		f.Seek(0, 0)
		khz, ok := parseCPUInfoTSC(f)
		f.Close()
		if khz != tc.khz || ok != tc.ok {
			t.Errorf("%q: got %d %v, want %d %v", tc.text, khz, ok, tc.khz, tc.ok)
		}
	}
}

// A TCG guest of one vCPU keeps the kernel's LOCK prefixes (rewriting
// translated code costs every boot 55 ms), and on q35 or pc also boots
// without the local APIC timer (its calibration costs every boot 100
// ms); KVM and several vCPUs keep the timer and have the prefixes
// rewritten, microvm (no HPET) keeps the timer. A q35 guest, whatever the
// accelerator, has no PCIe port services (its hotplug is ACPI's).
func TestKernelParamsByMachineAndAccel(t *testing.T) {
	for _, tc := range []struct {
		machine, accel string
		vcpus          int
		apic, smp, q35 bool // noapictimer, noreplace-smp, pcie_ports=compat
	}{
		{MachineQ35, AccelTCG, 1, true, true, true},
		{MachinePC, AccelTCG, 1, true, true, false},
		{MachineQ35, AccelTCG, 2, false, false, true},
		{MachineQ35, AccelKVM, 1, false, false, true},
		{MachineMicrovm, AccelTCG, 1, false, true, false},
	} {
		cfg := baseConfig()
		cfg.MachineType, cfg.VCPUs = tc.machine, tc.vcpus
		cmdline := KernelCmdline(cfg, tc.accel)
		for param, want := range map[string]bool{"noapictimer": tc.apic, "noreplace-smp": tc.smp, "pcie_ports=compat": tc.q35} {
			if got := slices.Contains(strings.Fields(cmdline), param); got != want {
				t.Errorf("%s, %s, %d vCPUs: %s %v, want %v (%q)", tc.machine, tc.accel, tc.vcpus, param, got, want, cmdline)
			}
		}
		if !strings.HasSuffix(cmdline, " tsc_early_khz=2600000") {
			t.Errorf("%s, %s, %d vCPUs: the caller's parameters are not last: %q", tc.machine, tc.accel, tc.vcpus, cmdline)
		}
	}
}
