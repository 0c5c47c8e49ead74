// Package vm defines what Hull needs from a hypervisor: a handful of typed
// methods. The QEMU implementation lives in internal/vm/qemu.
package vm

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Share is a host directory exported into the guest as a shared
// filesystem, mounted by the agent by its tag.
type Share struct {
	// Tag names the share inside the guest (the 9p mount_tag).
	Tag string
	// HostPath is an existing host directory.
	HostPath string
	ReadOnly bool
}

// Config describes one VM. Every path is a host path.
type Config struct {
	// ID names the VM in logs and in QEMU's -name.
	ID string
	// Dir is the VM's runtime directory (created by the caller, removed
	// by the caller): QMP and agent sockets and the console log go here.
	Dir string
	// Binary is the QEMU executable; empty means qemu.DefaultBinary (Hull's
	// own QEMU on PATH, else the distribution's).
	Binary string
	// MachineType is "q35" (default), "pc" or "microvm".
	MachineType string
	// Firmware is an optional -bios image (e.g. qboot.rom); empty for QEMU's default.
	Firmware     string
	VCPUs        int
	MemoryMiB    int
	Kernel       string
	Initrd       string
	KernelParams []string
	// Accel is "auto" (KVM where usable, else TCG with a warning), "kvm" or "tcg".
	Accel string
	// TCGCacheMiB is TCG's translation cache (QEMU's tb-size) when the
	// VM runs without KVM; 0: qemu.TCGCacheMiB.
	TCGCacheMiB int
	Shares      []Share
	// ConsoleOutput, if set, is called with each line the guest writes
	// to its console (kernel messages and the agent's log), so a guest
	// failure shows in the host's log. The console log file gets every
	// line either way.
	ConsoleOutput func(line string)
	// NICs are the VM's network cards, in guest PCI order.
	NICs []NIC
	// Memory backs guest RAM with a file (VM templates,
	// docs/templates.md); nil: anonymous memory.
	Memory *MemoryFile
	// Restore, when set, is a saved device state (a template's) the VM
	// resumes from instead of booting; its RAM is Memory's file, mapped
	// copy-on-write. The caller keeps the file and may close it once
	// Start has returned.
	Restore *os.File
}

// MemoryFile is a file that holds a VM's RAM.
type MemoryFile struct {
	// Path is the file. A template's build creates it; a clone maps it
	// and never writes it.
	Path string
	// Shared maps the file shared: the guest's writes land in it (a
	// template being built). Otherwise the mapping is private: pages the
	// guest writes are copied, the rest stay the file's, shared on the
	// host by every VM that maps it.
	Shared bool
}

// NIC is a virtio-net card backed by an open tap or macvtap descriptor,
// which QEMU inherits (the hypervisor never opens a network device by
// name, so it cannot pick the wrong one).
type NIC struct {
	// ID names the NIC's netdev ("net0"); [A-Za-z0-9_-], unique.
	ID  string
	MAC net.HardwareAddr
	// TapFile is the open tap or macvtap queue. The caller keeps it and
	// may close it once Start has returned. Nil only while building a
	// template (Memory.Shared): the card then has no backend.
	TapFile *os.File
}

// Hypervisor runs one VM.
type Hypervisor interface {
	// Start launches the VM and returns once QEMU answers on QMP. The VM's
	// lifetime is not bound to ctx: ctx bounds only the start itself.
	Start(ctx context.Context) error
	// Stop asks the guest to power off, waits until ctx's deadline (or
	// grace if ctx has none), then kills it. It is idempotent.
	Stop(ctx context.Context, grace time.Duration) error
	// Done is closed when the VM process has exited and been reaped.
	Done() <-chan struct{}
	// Pid is the hypervisor process id (0 before Start).
	Pid() int
	// AgentSocket is the host unix socket that reaches the guest agent.
	AgentSocket() string
	// ConsoleLog is the file the guest console is written to.
	ConsoleLog() string
	// ConsoleTail is up to n of the console's last lines, oldest first.
	ConsoleTail(n int) []string
}

// WithConsole adds a guest console's last lines to err, so that a guest
// failure is visible from the host; err alone when there are none.
func WithConsole(err error, tail []string) error {
	if len(tail) == 0 {
		return err
	}
	return fmt.Errorf("%w\nguest console (last lines):\n  %s", err, strings.Join(tail, "\n  "))
}
