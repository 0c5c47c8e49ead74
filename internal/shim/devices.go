package shim

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/device"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
)

// openDevices opens and checks the spec's host devices for container
// id, each recorded in the sandbox's state first (docs/design.md invariant
// 7): from here on only these descriptors are used. A missing or
// different device fails with an error naming it; the caller's rollback
// (the container's release) closes what was opened.
func openDevices(h *state.Handle, sb *sandbox.Sandbox, spec *specs.Spec, id string, logger *log.Entry) (*device.Set, error) {
	set, err := device.Resolve(spec, device.Options{Container: id, Recorder: h, PrivilegedHostDevices: sb.PrivilegedHostDevices()})
	if err != nil {
		return nil, err
	}
	if set.Dropped > 0 {
		logger.WithField("devices", set.Dropped).Info("privileged container: host devices not passed (privileged_host_devices = false)")
	}
	for _, err := range set.Skipped {
		logger.WithError(err).Warn("privileged container: host device skipped")
	}
	return set, nil
}

// diskID names container id's i-th disk: QEMU's device id and the serial
// the guest finds it by (at most 20 characters).
func diskID(id string, i int) string {
	if len(id) > 12 {
		id = id[:12]
	}
	return fmt.Sprintf("h%s-%d", id, i)
}

// attachDevices hotplugs the block devices of set into the VM, by
// descriptor, and returns the agent's device list. Each attached disk is
// unplugged by the container's release (the KindFD record), so a failure
// here or later in Create detaches every disk already attached. In a
// privileged container a device that cannot be attached is skipped.
func attachDevices(ctx context.Context, sb *sandbox.Sandbox, set *device.Set, id string, fps failpoint.Set, logger *log.Entry) ([]*agent.Device, error) {
	if len(set.Devices) == 0 {
		return nil, nil
	}
	if d, ok := fps.Armed(failpoint.DeviceDelay); ok {
		logger.WithField("delay", d).Warn("failpoint device-delay: waiting before the hotplug")
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var out []*agent.Device
	for i, d := range set.Devices {
		ad := &agent.Device{ContainerPath: d.Spec.Path, Type: d.Spec.Type, Major: d.Spec.Major, Minor: d.Spec.Minor}
		if d.Spec.FileMode != nil {
			ad.FileMode = uint32(d.Spec.FileMode.Perm())
		}
		if d.Spec.UID != nil {
			ad.Uid = *d.Spec.UID
		}
		if d.Spec.GID != nil {
			ad.Gid = *d.Spec.GID
		}
		if d.Block() {
			disk, err := sb.AttachDevice(ctx, diskID(id, i), d)
			if err != nil {
				if set.Privileged {
					logger.WithError(err).Warn("privileged container: host device skipped")
					continue
				}
				return nil, err
			}
			ad.Serial = disk.Serial
			logger.WithField("device", d.Name()).WithField("disk", disk.ID).Info("host device attached")
		}
		out = append(out, ad)
	}
	return out, nil
}
