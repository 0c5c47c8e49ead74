package e2e

import (
	"bytes"
	"crypto/rand"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guestimage/bzimage"
	"github.com/hull-runtime/hull/internal/testenv"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

func TestRunOutputAndExitCode(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	code := r.exitCode()
	if code != 3 {
		t.Fatalf("exit code %d, want 3; stderr:\n%s", code, r.stderr.String())
	}
	if got := r.stdout.String(); got != "out\n" {
		t.Errorf("stdout = %q, want %q", got, "out\n")
	}
	if got := commandStderr(r.stderr.String()); got != "err\n" {
		t.Errorf("stderr = %q, want %q", got, "err\n")
	}
}

// The Debian-kernel fallback (GUEST_KERNEL=debian, docs/kernel.md): its
// guest, with the modules the agent loads, boots and runs a command. The
// release the command sees is Debian's, not Hull's kernel's.
func TestRunDebianKernel(t *testing.T) {
	vals, why := testenv.Env("HULL_TEST_DEBIAN_KERNEL", "HULL_TEST_DEBIAN_INITRD")
	testenv.Require(t, why)
	r := newRun(t, "--kernel", vals[0], "--initrd", vals[1], "--rootfs", testEnv.rootfs, "--", "uname", "-r")
	if code := r.exitCode(); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.stderr.String())
	}
	release := strings.TrimSpace(r.stdout.String())
	if !strings.HasSuffix(release, "-amd64") {
		t.Errorf("uname -r in the Debian kernel's guest = %q, want Debian's release (...-amd64)", release)
	}
}

func TestRunStdinRoundTrip(t *testing.T) {
	in := make([]byte, 1<<20)
	if _, err := rand.Read(in); err != nil {
		t.Fatal(err)
	}
	r := newRun(t, "--rootfs", testEnv.rootfs, "-i", "--", "cat")
	r.cmd.Stdin = bytes.NewReader(in)
	if code := r.exitCode(); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.stderr.String())
	}
	if !bytes.Equal(r.stdout.Bytes(), in) {
		t.Fatalf("stdout differs from stdin: got %d bytes, want %d", r.stdout.Len(), len(in))
	}

	// The checksum computed inside the guest matches the host's.
	r2 := newRun(t, "--rootfs", testEnv.rootfs, "-i", "--", "sha256sum")
	r2.cmd.Stdin = bytes.NewReader(in)
	if code := r2.exitCode(); code != 0 {
		t.Fatalf("sha256sum exit code %d; stderr:\n%s", code, r2.stderr.String())
	}
	want := sha256Hex(in)
	if got := strings.Fields(r2.stdout.String()); len(got) == 0 || got[0] != want {
		t.Fatalf("guest sha256 = %q, want %s", r2.stdout.String(), want)
	}
}

func TestRunEchoPipe(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "-i", "--", "cat")
	r.cmd.Stdin = strings.NewReader("hi\n")
	if code := r.exitCode(); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.stderr.String())
	}
	if got := r.stdout.String(); got != "hi\n" {
		t.Fatalf("stdout = %q, want %q", got, "hi\n")
	}
}

func TestRunSIGTERMForwarded(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c", "echo ready; exec sleep 1000")
	r.startAndWaitFor("ready")
	if got := qemuOf(r.runDir); len(got) != 1 {
		t.Fatalf("want exactly one QEMU for the run, found %v", got)
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	if code := r.wait(time.Minute); code != 143 {
		t.Fatalf("exit code %d, want 143; stderr:\n%s", code, r.stderr.String())
	}
	if got := qemuOf(r.runDir); len(got) != 0 {
		t.Fatalf("QEMU still running after hull run exited: %v", got)
	}
}

func TestRunSIGKILLTakesQEMUDown(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c", "echo ready; exec sleep 1000")
	r.startAndWaitFor("ready")
	qemu := qemuOf(r.runDir)
	if len(qemu) != 1 {
		t.Fatalf("want exactly one QEMU for the run, found %v", qemu)
	}
	r.cmd.Process.Kill()
	r.cmd.Wait()
	killed := time.Now()
	for syscall.Kill(qemu[0].Pid, 0) == nil && !isZombie(qemu[0].Pid) {
		if time.Since(killed) > 2*time.Second {
			syscall.Kill(qemu[0].Pid, syscall.SIGKILL)
			t.Fatalf("QEMU %d still running 2 s after hull run was SIGKILLed", qemu[0].Pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("QEMU gone %v after its parent was SIGKILLed", time.Since(killed).Round(time.Millisecond))
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

func TestRunTTY(t *testing.T) {
	master, slave := openPTY(t)
	setWinsize(t, master, 24, 80)
	r := newRun(t, "--rootfs", testEnv.rootfs, "-i", "-t", "--", "sh", "-c", "tty; stty size; read x; stty size")
	r.cmd.Stdin, r.cmd.Stdout, r.cmd.Stderr = slave, slave, slave
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	defer master.Close()
	out := waitForOutput(t, master, "24 80", time.Minute)
	if !strings.Contains(out, "/dev/pts/") {
		t.Fatalf("tty did not print a terminal path: %q", out)
	}
	setWinsize(t, master, 50, 120) // the kernel sends SIGWINCH to hull run
	time.Sleep(time.Second)        // let hull forward the new size before the command asks
	master.Write([]byte("\r"))
	waitForOutput(t, master, "50 120", time.Minute)
	if code := r.wait(time.Minute); code != 0 {
		t.Fatalf("exit code %d", code)
	}
}

func TestRunBadInput(t *testing.T) {
	requireE2E(t)
	notExec := filepath.Join(testEnv.rootfs, "etc", "hostname")
	if _, err := os.Stat(notExec); err != nil {
		t.Fatalf("rootfs lacks %s: %v", notExec, err)
	}
	cases := []struct {
		name     string
		args     []string
		code     int
		mentions string
	}{
		{"missing kernel", []string{"--kernel", "/nonexistent/vmlinux", "--rootfs", testEnv.rootfs, "--", "true"}, 125, "/nonexistent/vmlinux"},
		{"missing initrd", []string{"--initrd", "/nonexistent/initrd.img", "--rootfs", testEnv.rootfs, "--", "true"}, 125, "/nonexistent/initrd.img"},
		{"missing rootfs", []string{"--rootfs", "/nonexistent/rootfs", "--", "true"}, 125, "/nonexistent/rootfs"},
		{"zero memory", []string{"--memory", "0", "--rootfs", testEnv.rootfs, "--", "true"}, 125, "--memory 0"},
		{"command not found", []string{"--rootfs", testEnv.rootfs, "--", "no-such-command"}, 127, "no-such-command"},
		{"command not executable", []string{"--rootfs", testEnv.rootfs, "--", "/etc/hostname"}, 126, "/etc/hostname"},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			r := newRun(t, c.args...)
			code := r.exitCode()
			if code != c.code {
				t.Fatalf("exit code %d, want %d; stderr:\n%s", code, c.code, r.stderr.String())
			}
			if !strings.Contains(r.stderr.String(), c.mentions) {
				t.Fatalf("error does not name %q:\n%s", c.mentions, r.stderr.String())
			}
		})
	}
}

func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("opening /dev/ptmx: %v", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking pty: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening pty slave: %v", err)
	}
	return master, slave
}

func setWinsize(t *testing.T, f *os.File, rows, cols uint16) {
	t.Helper()
	if err := unix.IoctlSetWinsize(int(f.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}); err != nil {
		t.Fatalf("setting window size: %v", err)
	}
}

// startAndWaitFor starts hull run and returns its stdout once it has
// said want.
func (r *hullRun) startAndWaitFor(want string) string {
	r.t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		r.t.Fatal(err)
	}
	r.cmd.Stdout = pw
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	pw.Close()
	r.t.Cleanup(func() { pr.Close() })
	return waitForOutput(r.t, pr, want, time.Minute)
}

// Hull's kernel keeps its init sections, unmapped, instead of poisoning
// and freeing them (guest/kernel/patches, docs/kernel.md): under TCG the
// poisoning of code the boot had run cost every boot ≈ 200 ms. The
// kernel's log says which it did.
func TestRunKernelKeepsInitmem(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c", "dmesg | grep 'kernel image (initmem)'")
	if code := r.exitCode(); code != 0 {
		t.Fatalf("exit code %d (no initmem line in the kernel's log?); stderr:\n%s", code, r.stderr.String())
	}
	got := r.stdout.String()
	if !strings.Contains(got, "Keeping unused kernel image (initmem) memory, unmapped") || strings.Contains(got, "Freeing") {
		t.Errorf("kernel log: %q, want the init sections kept, not freed", got)
	}
}

// The kernel QEMU boots carries no symbol table (hack/build-kernel.sh
// strips Hull's; Debian's is the payload of its bzImage, which the
// kernel's own build strips with objcopy -S): QEMU
// reads and sorts one at every start and keeps it on its heap
// (docs/kernel.md). Its PVH note, without which QEMU cannot boot it, is
// kept; every test that boots it shows the rest.
func TestKernelHasNoSymbolTable(t *testing.T) {
	requireE2E(t)
	b, err := os.ReadFile(testEnv.kernel)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", testEnv.kernel, err)
	}
	defer f.Close()
	for _, name := range []string{".symtab", ".strtab"} {
		if s := f.Section(name); s != nil {
			t.Errorf("%s has a %s section (%d bytes): want it stripped", testEnv.kernel, name, s.Size)
		}
	}
	if _, ok, err := bzimage.PVHEntry(b); err != nil || !ok {
		t.Errorf("%s: PVH note found %v (%v), want it kept", testEnv.kernel, ok, err)
	}
}

// A q35 guest's hotplug root ports are bridges without PCIe port
// services (pcie_ports=compat; their hotplug is ACPI's, docs/boot.md):
// probing the services of the eight ports took ≈ 20 ms of every boot;
// the bridges are the VM's qemu.HotplugPorts.
// test/e2e/cri TestHullDevices hotplugs disks onto them.
func TestRunNoPCIePortServices(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c",
		"ls /sys/bus/pci_express/devices | wc -l; grep -l 0x060400 /sys/bus/pci/devices/*/class | wc -l")
	if code := r.exitCode(); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.stderr.String())
	}
	if got, want := strings.Fields(r.stdout.String()), []string{"0", strconv.Itoa(qemu.HotplugPorts)}; !slices.Equal(got, want) {
		t.Errorf("PCIe port services, PCI bridges = %q, want %q", got, want)
	}
}

// The kernel parameters that keep an idle guest quiet under TCG are in
// effect: no clocksource watchdog (tsc=reliable), no proactive compaction
// (docs/performance.md); and a one-vCPU guest under TCG ticks on the HPET,
// its local APIC timer, whose calibration costs every boot 100 ms, off
// (noapictimer). The suite runs under TCG (docs/boot.md).
//
// The kernel replaces its early TSC clocksource (tsc-early) by the TSC
// proper once it has refined the TSC's calibration, a second after its
// clocksource initcall; a guest that boots fast runs the command before
// that (CI, once), so the command waits for the switch, up to 5 s. A TSC
// the watchdog had found unstable would read "hpet" instead.
func TestRunGuestIdleSettings(t *testing.T) {
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c",
		"cat /proc/sys/vm/compaction_proactiveness; c=/sys/devices/system/clocksource/clocksource0/current_clocksource; "+
			`i=0; while [ "$(cat $c)" = tsc-early ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; cat $c; `+
			"cat /sys/devices/system/clockevents/clockevent0/current_device")
	if code := r.exitCode(); code != 0 {
		t.Fatalf("exit code %d; stderr:\n%s", code, r.stderr.String())
	}
	if got, want := r.stdout.String(), "0\ntsc\nhpet\n"; got != want {
		t.Errorf("compaction_proactiveness, clocksource and clockevent = %q, want %q", got, want)
	}
}

// A run's QEMU is the one an empty hypervisor.qemu.path chooses (docs/qemu.md):
// Hull's own under make test, Debian's in its debian-qemu suite, as
// HULL_TEST_QEMU says. Its guest has the HPET, which a QEMU built without
// default devices loses unless its device list names it (an idle guest
// then ticks on the PIT).
func TestRunUsesTheQEMUInEffect(t *testing.T) {
	want, why := testenv.Env("HULL_TEST_QEMU")
	testenv.Require(t, why)
	r := newRun(t, "--rootfs", testEnv.rootfs, "--", "sh", "-c",
		"cat /sys/devices/system/clocksource/clocksource0/available_clocksource; echo ready; exec sleep 1000")
	out := r.startAndWaitFor("ready")
	procs := qemuOf(r.runDir)
	if len(procs) != 1 {
		t.Fatalf("want exactly one QEMU for the run, found %v", procs)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", procs[0].Pid))
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(exe) != want[0] {
		t.Errorf("the run's QEMU is %s, want %s (HULL_TEST_QEMU)", exe, want[0])
	}
	if !strings.Contains(out, "hpet") {
		t.Errorf("the guest's clock sources are %q, want the HPET among them", out)
	}
}
