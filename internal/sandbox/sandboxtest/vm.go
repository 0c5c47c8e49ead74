// Package sandboxtest holds fakes of what a sandbox runs on, a VM and a
// guest agent, for unit tests of the sandbox and of the shim that drive
// its lifecycle without QEMU, without a guest and without root. Build one
// with sandbox.New(o, vm, agent, ping).
package sandboxtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/vm"
)

var _ sandbox.VM = (*VM)(nil)

// Calls is the order of the calls made to the fakes that share it, each
// as "vm.Stop" or "agent.StartContainer c1/e1".
type Calls struct {
	mu   sync.Mutex // guards list
	list []string
}

func (c *Calls) add(format string, args ...any) {
	c.mu.Lock()
	c.list = append(c.list, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// List is the calls so far, oldest first.
func (c *Calls) List() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.list)
}

// Count is how many calls were exactly call.
func (c *Calls) Count(call string) int {
	n := 0
	for _, got := range c.List() {
		if got == call {
			n++
		}
	}
	return n
}

// VM is a fake hypervisor whose process "exits" when Exit or Stop is
// called. It has no process: Pid is 0.
type VM struct {
	calls *Calls
	done  chan struct{}
	exit  sync.Once

	// mu guards the fields below.
	mu    sync.Mutex
	disks []string
	// StopErr is what Stop returns (the VM exits all the same).
	StopErr error
	// AddDiskErr is what AddDisk returns; nil attaches the disk.
	AddDiskErr error
	// Console is the guest console's lines (ConsoleTail).
	Console []string
}

// NewVM is a running fake VM recording its calls in calls (nil: its own).
func NewVM(calls *Calls) *VM {
	if calls == nil {
		calls = &Calls{}
	}
	return &VM{calls: calls, done: make(chan struct{})}
}

// Exit makes the VM's process exit, as when QEMU is killed or the guest
// panics: Done closes. Idempotent.
func (v *VM) Exit() { v.exit.Do(func() { close(v.done) }) }

func (v *VM) Start(context.Context) error { v.calls.add("vm.Start"); return nil }

// Stop records the call and makes the VM exit, as QEMU's Stop does.
func (v *VM) Stop(context.Context, time.Duration) error {
	v.calls.add("vm.Stop")
	v.Exit()
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.StopErr
}

func (v *VM) Done() <-chan struct{} { return v.done }
func (v *VM) Pid() int              { return 0 }
func (v *VM) AgentSocket() string   { return "" }
func (v *VM) ConsoleLog() string    { return "" }

func (v *VM) ConsoleTail(n int) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.Console[max(0, len(v.Console)-n):])
}

func (v *VM) AddDisk(_ context.Context, d vm.DiskConfig) (vm.Disk, error) {
	v.calls.add("vm.AddDisk %s", d.ID)
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.AddDiskErr != nil {
		return vm.Disk{}, v.AddDiskErr
	}
	v.disks = append(v.disks, d.ID)
	return vm.Disk{ID: d.ID, Serial: d.ID, Driver: d.Driver}, nil
}

func (v *VM) RemoveDisk(_ context.Context, id string) error {
	v.calls.add("vm.RemoveDisk %s", id)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.disks = slices.DeleteFunc(v.disks, func(d string) bool { return d == id })
	return nil
}

func (v *VM) Disks() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.disks)
}

// InjectNMI records the call (the guest-panic failpoint); the guest does
// not panic: call Exit for that.
func (v *VM) InjectNMI(context.Context) error { v.calls.add("vm.InjectNMI"); return nil }
