package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/hull-runtime/hull/internal/device"
	"github.com/hull-runtime/hull/internal/vm"
)

// unplugTimeout bounds the unplug of one disk on release: the guest's
// ACPI eject takes about 90 ms to DEVICE_DELETED under TCG.
const unplugTimeout = 10 * time.Second

// PrivilegedHostDevices is the config's runtime.privileged_host_devices.
func (s *Sandbox) PrivilegedHostDevices() bool { return s.cfg.Runtime.PrivilegedHostDevices }

// AttachDevice hotplugs the block device d (its open descriptor) into
// the VM as disk id with the configured block_device_driver, and
// registers its unplug with the device's release, so that the one
// release path unplugs it (waiting for DEVICE_DELETED) before closing
// the descriptor.
func (s *Sandbox) AttachDevice(ctx context.Context, id string, d *device.Device) (vm.Disk, error) {
	disk, err := s.vm.AddDisk(ctx, vm.DiskConfig{ID: id, File: d.File, ReadOnly: d.ReadOnly, Driver: s.cfg.Hypervisor.BlockDeviceDriver})
	if err != nil {
		return vm.Disk{}, fmt.Errorf("host device %s (container path %s): %w", d.Name(), d.Spec.Path, err)
	}
	device.Attach(d, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, unplugTimeout)
		defer cancel()
		err := s.vm.RemoveDisk(ctx, id)
		select {
		case <-s.vm.Done():
			return nil // what QEMU held died with it
		default:
		}
		return err
	})
	return disk, nil
}

// Disks lists the ids of the disks hotplugged into the VM.
func (s *Sandbox) Disks() []string {
	if s.vm == nil {
		return nil
	}
	return s.vm.Disks()
}
