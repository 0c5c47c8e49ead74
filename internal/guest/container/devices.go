package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/guest/errdefs"
	"github.com/hull-runtime/hull/internal/guest/nsinit"
)

// Device is a device node to create in a container (agent API Device).
type Device struct {
	Path   string
	Type   string // "b" or "c"
	Serial string // block: the hotplugged disk's serial
	Major  int64  // char: the guest device's number
	Minor  int64
	Mode   uint32
	UID    uint32
	GID    uint32
}

// SysBlock is where the guest's block devices are listed.
var SysBlock = "/sys/block"

// diskPoll is how often a disk that has not appeared yet is looked for.
// ACPI hotplug on q35 takes about 20 ms to the guest's uevent.
const diskPoll = 10 * time.Millisecond

// diskWait bounds the wait when ctx has no deadline.
const diskWait = 10 * time.Second

// resolveDevices turns the host's device list into the nodes to create:
// a block device becomes the guest disk with its serial (waited for,
// bounded by ctx), with the guest's major:minor.
func resolveDevices(ctx context.Context, devs []Device) ([]nsinit.Device, error) {
	var out []nsinit.Device
	for _, d := range devs {
		if !filepath.IsAbs(d.Path) || filepath.Clean(d.Path) == "/" {
			return nil, fmt.Errorf("device path %q: %w", d.Path, errdefs.ErrInvalidArgument)
		}
		nd := nsinit.Device{Path: filepath.Clean(d.Path), Type: d.Type, Major: d.Major, Minor: d.Minor, Mode: d.Mode, UID: d.UID, GID: d.GID}
		switch d.Type {
		case "b":
			if d.Serial == "" {
				return nil, fmt.Errorf("block device %s: no disk serial: %w", d.Path, errdefs.ErrInvalidArgument)
			}
			name, maj, mnr, err := WaitDisk(ctx, d.Serial)
			if err != nil {
				return nil, fmt.Errorf("block device %s: %w", d.Path, err)
			}
			nd.Major, nd.Minor, nd.GuestName = maj, mnr, name
		case "c", "u":
			nd.Type = "c"
		default:
			return nil, fmt.Errorf("device %s: type %q: %w", d.Path, d.Type, errdefs.ErrInvalidArgument)
		}
		if nd.Mode == 0 {
			nd.Mode = 0o666
		}
		out = append(out, nd)
	}
	return out, nil
}

// WaitDisk waits until a disk with the given serial is in SysBlock and
// returns its name and device number.
func WaitDisk(ctx context.Context, serial string) (string, int64, int64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, diskWait)
		defer cancel()
	}
	t := time.NewTicker(diskPoll)
	defer t.Stop()
	for {
		if name, ok := findDisk(serial); ok {
			b, err := os.ReadFile(filepath.Join(SysBlock, name, "dev"))
			if err == nil {
				var maj, mnr int64
				if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &maj, &mnr); err == nil {
					return name, maj, mnr, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", 0, 0, fmt.Errorf("disk with serial %s did not appear in the guest: %w", serial, errors.Join(ctx.Err(), errdefs.ErrNotFound))
		case <-t.C:
		}
	}
}

// findDisk looks for the disk whose serial is serial: virtio-blk shows it
// in <dev>/serial, SCSI disks in the unit serial number VPD page.
func findDisk(serial string) (string, bool) {
	ents, err := os.ReadDir(SysBlock)
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		dir := filepath.Join(SysBlock, e.Name())
		if b, err := os.ReadFile(filepath.Join(dir, "serial")); err == nil && strings.TrimSpace(string(b)) == serial {
			return e.Name(), true
		}
		if b, err := os.ReadFile(filepath.Join(dir, "device", "vpd_pg80")); err == nil && len(b) > 4 &&
			string(bytes.TrimSpace(bytes.Trim(b[4:], "\x00"))) == serial {
			return e.Name(), true
		}
	}
	return "", false
}
