package vm

import "os"

// Block device drivers (config: hypervisor.qemu.block_device_driver).
const (
	DiskVirtioBlk  = "virtio-blk"
	DiskVirtioSCSI = "virtio-scsi"
)

// DiskConfig is a block device to hotplug into a running VM. The
// hypervisor gets the open descriptor, never a path: what the caller
// checked is what the guest gets.
type DiskConfig struct {
	// ID names the disk: the QEMU device id, and the serial the guest
	// finds it by. [A-Za-z0-9_-], at most MaxDiskID bytes.
	ID string
	// File is the open block device (or regular file). The caller keeps
	// it open until RemoveDisk.
	File     *os.File
	ReadOnly bool
	// Driver is DiskVirtioBlk (default) or DiskVirtioSCSI.
	Driver string
}

// MaxDiskID is the longest disk id: a virtio-blk serial holds 20 bytes.
const MaxDiskID = 20

// Disk is a hotplugged disk as the guest sees it.
type Disk struct {
	ID string
	// Serial is what the guest reads in /sys/block/<dev>/serial
	// (virtio-blk) or the unit serial VPD page (SCSI).
	Serial string
	Driver string
}
