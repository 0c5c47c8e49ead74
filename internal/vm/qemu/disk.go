package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/rollback"
	"github.com/hull-runtime/hull/internal/vm"
	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

// HotplugPorts is how many pcie-root-ports a q35 VM gets for hotplug
// (one disk, or the virtio-scsi controller, each). QEMU 7.2's q35 uses
// ACPI PCI hotplug on them (about 20 ms to the guest's uevent; native
// PCIe hotplug would wait 5 s for its attention button).
const HotplugPorts = 8

// hotplugSlot is the PCI slot of the root ports (functions 0-7).
const hotplugSlot = 0x10

// scsiController is the id of the virtio-scsi controller, hotplugged on
// the first SCSI disk.
const scsiController = "scsi0"

var diskIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// hotplugArgs are the command-line devices that make hotplug possible:
// root ports on q35 (pc hotplugs onto pci.0 itself; microvm cannot).
func hotplugArgs(cfg vm.Config) []string {
	if cfg.MachineType != MachineQ35 && cfg.MachineType != "" {
		return nil
	}
	var a []string
	for i := range HotplugPorts {
		opts := "pcie-root-port,id=" + rootPort(i) + ",bus=pcie.0,chassis=" + strconv.Itoa(i+1) +
			",addr=" + fmt.Sprintf("%x.%d", hotplugSlot, i)
		if i == 0 {
			opts += ",multifunction=on"
		}
		a = append(a, "-device", opts)
	}
	return a
}

func rootPort(i int) string { return "rp" + strconv.Itoa(i) }

// hotplug is what the QEMU holds for hotplugged disks.
type hotplug struct {
	// mu guards the fields below; held across a whole AddDisk/RemoveDisk,
	// so port and SCSI-id allocation and the QMP sequences never
	// interleave.
	mu      sync.Mutex
	disks   map[string]*disk
	ports   [HotplugPorts]string // device id on each root port, "" if free
	scsiIDs map[int]string       // SCSI target -> disk id
	scsi    bool                 // the controller is plugged
}

type disk struct {
	cfg    vm.DiskConfig
	fdset  int
	node   string
	port   int // root port index, -1 for SCSI or pc
	scsiID int
}

func (q *QEMU) hp() *hotplug {
	q.hotplugOnce.Do(func() {
		q.hotplugState = &hotplug{disks: map[string]*disk{}, scsiIDs: map[int]string{}}
	})
	return q.hotplugState
}

func (q *QEMU) qmpForHotplug() (*qmp.Client, error) {
	select {
	case <-q.done:
		return nil, errors.New("the VM is not running")
	default:
	}
	c := q.QMP()
	if c == nil {
		return nil, errors.New("the VM is not running")
	}
	if q.cfg.MachineType == MachineMicrovm {
		return nil, errors.New("machine type microvm has no hotplug: use q35")
	}
	return c, nil
}

// AddDisk hotplugs d into the running VM: its descriptor into a QEMU fd
// set (add-fd, SCM_RIGHTS), a block node on /dev/fdset/N (blockdev-add),
// then the device (virtio-blk-pci on a free root port, or scsi-hd on the
// virtio-scsi controller) with serial d.ID. A device of size 0 (a
// detached loop device, which QEMU would accept silently) is refused. On
// error every step already done is undone.
func (q *QEMU) AddDisk(ctx context.Context, d vm.DiskConfig) (_ vm.Disk, retErr error) {
	if d.Driver == "" {
		d.Driver = vm.DiskVirtioBlk
	}
	if !diskIDRe.MatchString(d.ID) || len(d.ID) > vm.MaxDiskID {
		return vm.Disk{}, fmt.Errorf("hotplugging disk %q: the id must be 1-%d characters of [A-Za-z0-9_-]", d.ID, vm.MaxDiskID)
	}
	if d.Driver != vm.DiskVirtioBlk && d.Driver != vm.DiskVirtioSCSI {
		return vm.Disk{}, fmt.Errorf("hotplugging disk %s: unknown driver %q (virtio-blk, virtio-scsi)", d.ID, d.Driver)
	}
	if d.File == nil {
		return vm.Disk{}, fmt.Errorf("hotplugging disk %s: no file", d.ID)
	}
	driver, err := checkDiskFile(d.File)
	if err != nil {
		return vm.Disk{}, fmt.Errorf("hotplugging disk %s (%s): %w", d.ID, d.File.Name(), err)
	}
	c, err := q.qmpForHotplug()
	if err != nil {
		return vm.Disk{}, fmt.Errorf("hotplugging disk %s: %w", d.ID, err)
	}
	hp := q.hp()
	hp.mu.Lock()
	defer hp.mu.Unlock()
	if _, ok := hp.disks[d.ID]; ok {
		return vm.Disk{}, fmt.Errorf("hotplugging disk %s: already attached", d.ID)
	}
	var undo rollback.Stack
	defer func() {
		if retErr != nil {
			if err := undo.Unwind(); err != nil {
				q.log.Warn("undoing a failed hotplug", "disk", d.ID, "error", err)
			}
		}
	}()
	wrap := func(err error) error { return fmt.Errorf("hotplugging disk %s (%s): %w", d.ID, d.File.Name(), err) }

	// Pick the bus first: nothing to undo if none is free.
	dk := &disk{cfg: d, port: -1, scsiID: -1, node: "drv-" + d.ID}
	if d.Driver == vm.DiskVirtioSCSI {
		for i := range 256 {
			if _, used := hp.scsiIDs[i]; !used {
				dk.scsiID = i
				break
			}
		}
		if dk.scsiID < 0 {
			return vm.Disk{}, wrap(errors.New("no free SCSI target"))
		}
	}
	needPort := q.cfg.MachineType != MachinePC && (d.Driver == vm.DiskVirtioBlk || !hp.scsi)
	port := -1
	if needPort {
		for i, id := range hp.ports {
			if id == "" {
				port = i
				break
			}
		}
		if port < 0 {
			return vm.Disk{}, wrap(fmt.Errorf("all %d hotplug ports are in use", HotplugPorts))
		}
	}
	if d.Driver == vm.DiskVirtioSCSI && !hp.scsi {
		// The controller, once per VM, on its own port.
		args := map[string]any{"driver": "virtio-scsi-pci", "id": scsiController}
		if port >= 0 {
			args["bus"] = rootPort(port)
		}
		if err := c.Execute(ctx, "device_add", args, nil); err != nil {
			return vm.Disk{}, wrap(err)
		}
		hp.scsi = true
		if port >= 0 {
			hp.ports[port] = scsiController
		}
		port = -1
	}

	// add-fd: QEMU dups the descriptor into a set of its own.
	info, err := c.AddFD(ctx, int(d.File.Fd()), -1, "hull:"+d.ID)
	if err != nil {
		return vm.Disk{}, wrap(err)
	}
	dk.fdset = info.FDSetID
	undo.Add("remove-fd", func() error { return q.removeFDSet(c, dk.fdset) })

	node := map[string]any{
		"driver":    driver,
		"node-name": dk.node,
		"filename":  "/dev/fdset/" + strconv.Itoa(info.FDSetID),
		"read-only": d.ReadOnly,
		// The runtime does not arbitrate sharing of host devices (runc
		// does not either): no image locks between pods.
		"locking": "off",
		"aio":     "threads",
		"cache":   map[string]any{"direct": false, "no-flush": false},
	}
	if err := c.Execute(ctx, "blockdev-add", node, nil); err != nil {
		return vm.Disk{}, wrap(err)
	}
	undo.Add("blockdev-del", func() error { return q.blockdevDel(c, dk.node) })

	dev := map[string]any{"id": d.ID, "drive": dk.node, "serial": d.ID}
	if d.Driver == vm.DiskVirtioSCSI {
		dev["driver"] = "scsi-hd"
		dev["bus"] = scsiController + ".0"
		dev["channel"] = 0
		dev["scsi-id"] = dk.scsiID
		dev["lun"] = 0
	} else {
		dev["driver"] = "virtio-blk-pci"
		if port >= 0 {
			dev["bus"] = rootPort(port)
		}
	}
	// A device_add cut short by ctx may still have happened.
	undo.Add("device_del", func() error {
		uctx, cancel := context.WithTimeout(context.Background(), unplugTimeout)
		defer cancel()
		return ignoreGone(q.deviceDel(uctx, c, d.ID))
	})
	if err := c.Execute(ctx, "device_add", dev, nil); err != nil {
		return vm.Disk{}, wrap(err)
	}
	dk.port = port
	if port >= 0 {
		hp.ports[port] = d.ID
	}
	if dk.scsiID >= 0 {
		hp.scsiIDs[dk.scsiID] = d.ID
	}
	hp.disks[d.ID] = dk
	q.log.Info("disk hotplugged", "disk", d.ID, "file", d.File.Name(), "driver", d.Driver, "fdset", dk.fdset, "read_only", d.ReadOnly)
	return vm.Disk{ID: d.ID, Serial: d.ID, Driver: d.Driver}, nil
}

// unplugTimeout bounds each QMP step of an unplug after DEVICE_DELETED,
// and the whole undo of a failed hotplug.
const unplugTimeout = 10 * time.Second

// checkDiskFile returns the QEMU block driver for f: host_device for a
// block device of non-zero size, file for a non-empty regular file.
func checkDiskFile(f *os.File) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
		if err != nil {
			return "", fmt.Errorf("reading its size: %w", err)
		}
		if size == 0 {
			return "", errors.New("the block device has size 0 (a detached loop device?)")
		}
		return "host_device", nil
	case unix.S_IFREG:
		if st.Size == 0 {
			return "", errors.New("the file is empty")
		}
		return "file", nil
	default:
		return "", fmt.Errorf("not a block device or regular file (mode %#o)", st.Mode&unix.S_IFMT)
	}
}

// RemoveDisk hot-unplugs the disk id: device_del, waiting for QEMU's
// DEVICE_DELETED (the guest has let go), then blockdev-del and
// remove-fd, after which QEMU holds no descriptor of it. A disk that is
// not attached, or a VM that is not running, is success. ctx bounds the
// wait for the guest.
func (q *QEMU) RemoveDisk(ctx context.Context, id string) error {
	hp := q.hp()
	hp.mu.Lock()
	defer hp.mu.Unlock()
	dk, ok := hp.disks[id]
	if !ok {
		return nil
	}
	c, err := q.qmpForHotplug()
	if err != nil {
		delete(hp.disks, id) // gone with the VM
		return nil
	}
	if err := q.deviceDel(ctx, c, id); err != nil {
		return fmt.Errorf("unplugging disk %s: %w", id, err)
	}
	if dk.port >= 0 {
		hp.ports[dk.port] = ""
	}
	if dk.scsiID >= 0 {
		delete(hp.scsiIDs, dk.scsiID)
	}
	delete(hp.disks, id)
	if err := errors.Join(q.blockdevDel(c, dk.node), q.removeFDSet(c, dk.fdset)); err != nil {
		return fmt.Errorf("unplugging disk %s: %w", id, err)
	}
	q.log.Info("disk unplugged", "disk", id)
	return nil
}

// Disks lists the ids of the hotplugged disks.
func (q *QEMU) Disks() []string {
	hp := q.hp()
	hp.mu.Lock()
	defer hp.mu.Unlock()
	var ids []string
	for id := range hp.disks {
		ids = append(ids, id)
	}
	return ids
}

// deviceDel unplugs a device and waits for DEVICE_DELETED; the watcher
// is registered before the command, so the event cannot be missed.
func (q *QEMU) deviceDel(ctx context.Context, c *qmp.Client, id string) error {
	w := c.Watch(qmp.DeviceDeleted(id))
	defer w.Stop()
	if err := c.Execute(ctx, "device_del", map[string]string{"id": id}, nil); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && qe.Class == "DeviceNotFound" {
			return nil
		}
		return err
	}
	if _, err := w.Wait(ctx); err != nil {
		return fmt.Errorf("waiting for DEVICE_DELETED: %w", err)
	}
	return nil
}

func (q *QEMU) blockdevDel(c *qmp.Client, node string) error {
	ctx, cancel := context.WithTimeout(context.Background(), unplugTimeout)
	defer cancel()
	return ignoreGone(c.Execute(ctx, "blockdev-del", map[string]string{"node-name": node}, nil))
}

func (q *QEMU) removeFDSet(c *qmp.Client, fdset int) error {
	ctx, cancel := context.WithTimeout(context.Background(), unplugTimeout)
	defer cancel()
	return ignoreGone(c.Execute(ctx, "remove-fd", map[string]int{"fdset-id": fdset}, nil))
}

// ignoreGone treats a QEMU that exited meanwhile as success: what it
// held died with it.
func ignoreGone(err error) error {
	if errors.Is(err, qmp.ErrClosed) {
		return nil
	}
	return err
}
