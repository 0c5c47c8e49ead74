package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
	"github.com/hull-runtime/hull/internal/device"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/hostfs"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/storage"
)

// ContainerRequest is one container to build: the task API's Create, as
// the sandbox needs it.
type ContainerRequest struct {
	ID     string
	Bundle string
	Spec   *specs.Spec
	// Rootfs are containerd's rootfs mounts (none: the bundle's rootfs,
	// or the spec's root.path, is already in place).
	Rootfs []*types.Mount
	Stdin  bool
	// Pause is the sandbox container: the pod's storages (the share, the
	// pod's /dev/shm) are mounted in the guest with it.
	Pause bool
	// Failpoints of the container steps (fault-injection tests only).
	Failpoints failpoint.Set
}

// CreateContainer does a container's host work and builds it in the
// guest: its host devices opened and checked, its rootfs mounted and
// shared with its binds, its disks hotplugged, then the agent's
// CreateContainer. Each resource is recorded in h (locked by the caller)
// before it is acquired; on error the caller releases the container
// (Release(h, r.ID)), which undoes every host step, and nothing was
// created in the guest. It returns the container's pid in the guest.
func (s *Sandbox) CreateContainer(ctx context.Context, h *state.Handle, r ContainerRequest) (uint32, error) {
	log := s.log.With("container", r.ID)
	devs, err := s.openDevices(h, r, log)
	if err != nil {
		return 0, withKind(errdefs.ErrFailedPrecondition, fmt.Errorf("container %s: %w", r.ID, err))
	}
	plan, err := s.shareContainer(h, r, log)
	if err != nil {
		return 0, err
	}
	specJSON, err := json.Marshal(plan.Spec)
	if err != nil {
		return 0, fmt.Errorf("encoding the guest spec: %w", err)
	}
	var storages []*agent.Storage
	if r.Pause {
		storages = podStorages()
	}
	cctx, cancel := context.WithTimeout(ctx, s.CreateTimeout())
	defer cancel()
	agentDevs, err := s.attachDevices(cctx, devs, r, log)
	if err != nil {
		return 0, withKind(errdefs.ErrFailedPrecondition, fmt.Errorf("container %s: %w", r.ID, err))
	}
	resp, err := s.client.CreateContainer(cctx, &agent.CreateContainerRequest{
		ContainerId: r.ID,
		OciSpec:     specJSON,
		Storages:    storages,
		Stdin:       r.Stdin,
		Devices:     agentDevs,
	})
	if err != nil {
		return 0, fmt.Errorf("creating container %s in the VM: %w", r.ID, agentclient.Err(err))
	}
	return resp.Pid, nil
}

// shareContainer mounts the container's rootfs (as runc's shim does) and
// binds it and the spec's bind mounts into the directory shared with the
// guest; it returns the spec the guest gets. The spec is checked first, so
// a spec the guest cannot take leaves nothing mounted. A sandbox container
// the agent runs Hull's pause for shares nothing: the guest would not use
// it.
func (s *Sandbox) shareContainer(h *state.Handle, r ContainerRequest, log *slog.Logger) (*storage.Plan, error) {
	plan, err := storage.GuestSpec(r.Spec, r.ID, s.TreeDir(), s.Hostname)
	if err != nil {
		return nil, withKind(errdefs.ErrInvalidArgument, err)
	}
	for _, d := range plan.Dropped {
		log.Debug("spec entry not passed to the guest", "dropped", d)
	}
	if s.runsHullPause(r) {
		log.Debug("sandbox container: Hull's pause runs in the guest, its rootfs and mounts are not shared")
		return plan, nil
	}
	rootfs := filepath.Join(r.Bundle, "rootfs")
	if len(r.Rootfs) > 0 {
		if err := storage.MountRootfs(h, r.ID, r.Rootfs, rootfs); err != nil {
			return nil, err
		}
	} else if r.Spec.Root != nil && r.Spec.Root.Path != "" {
		rootfs = r.Spec.Root.Path
		if !filepath.IsAbs(rootfs) {
			rootfs = filepath.Join(r.Bundle, rootfs)
		}
	}
	if err := r.Failpoints.Check(failpoint.RootfsMount); err != nil {
		return nil, err
	}
	if err := storage.MakeContainerDir(h, s.TreeDir(), r.ID); err != nil {
		return nil, err
	}
	if err := storage.BindInto(h, r.ID, s.TreeDir(), rootfs, plan.RootfsTarget, hostfs.BindOptions{}); err != nil {
		return nil, fmt.Errorf("sharing the rootfs: %w", err)
	}
	if err := r.Failpoints.Check(failpoint.ShareRootfs); err != nil {
		return nil, err
	}
	for _, b := range plan.Binds {
		if err := storage.BindInto(h, r.ID, s.TreeDir(), b.Source, b.Target, b.Options); err != nil {
			return nil, fmt.Errorf("sharing mount %s: %w", b.Source, err)
		}
	}
	if err := r.Failpoints.Check(failpoint.ShareMounts); err != nil {
		return nil, err
	}
	return plan, nil
}

// AnnotationContainerType is the annotation by which containerd's CRI
// marks a pod's sandbox container (ContainerTypeSandbox) and its other
// containers.
const (
	AnnotationContainerType = "io.kubernetes.cri.container-type"
	ContainerTypeSandbox    = "sandbox"
)

// runsHullPause says whether the agent will run Hull's pause for r, using
// nothing of its rootfs or mounts: r is the sandbox container of a CRI pod
// (the agent tells it by the same annotation) and the agent said it has
// the pause (docs/sandbox.md).
func (s *Sandbox) runsHullPause(r ContainerRequest) bool {
	return s.hullPause && r.Pause && r.Spec != nil && r.Spec.Annotations[AnnotationContainerType] == ContainerTypeSandbox
}

// RemoveContainer removes container id from the guest (killing what
// still runs in it); a container the agent does not know is removed.
func (s *Sandbox) RemoveContainer(ctx context.Context, id string) error {
	_, err := s.client.RemoveContainer(ctx, &agent.RemoveContainerRequest{ContainerId: id, Force: true})
	if err == nil || agentclient.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("removing container %s in the VM: %w", id, agentclient.Err(err))
}

// podStorages are mounted in the guest with the sandbox container,
// before anything else: the shared directory and the pod's /dev/shm.
func podStorages() []*agent.Storage {
	return []*agent.Storage{
		{Source: storage.SharedTag, Fstype: "9p", Options: []string{"trans=virtio", "version=9p2000.L", "msize=512000", "cache=mmap"}, MountPoint: storage.GuestSharedDir},
		{Source: "shm", Fstype: "tmpfs", Options: []string{"nosuid", "nodev", "noexec", "mode=1777", "size=65536k"}, MountPoint: storage.GuestShmDir},
	}
}

// openDevices opens and checks the spec's host devices, each recorded in
// the sandbox's state first (docs/design.md invariant 7): from here on
// only these descriptors are used. A missing or different device fails
// with an error naming it; the container's release closes what was
// opened.
func (s *Sandbox) openDevices(h *state.Handle, r ContainerRequest, log *slog.Logger) (*device.Set, error) {
	set, err := device.Resolve(r.Spec, device.Options{Container: r.ID, Recorder: h, PrivilegedHostDevices: s.PrivilegedHostDevices()})
	if err != nil {
		return nil, err
	}
	if set.Dropped > 0 {
		log.Info("privileged container: host devices not passed (privileged_host_devices = false)", "devices", set.Dropped)
	}
	for _, err := range set.Skipped {
		log.Warn("privileged container: host device skipped", "error", err)
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
// here or later detaches every disk already attached. In a privileged
// container a device that cannot be attached is skipped.
func (s *Sandbox) attachDevices(ctx context.Context, set *device.Set, r ContainerRequest, log *slog.Logger) ([]*agent.Device, error) {
	if len(set.Devices) == 0 {
		return nil, nil
	}
	if d, ok := r.Failpoints.Armed(failpoint.DeviceDelay); ok {
		log.Warn("failpoint device-delay: waiting before the hotplug", "delay", d)
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var out []*agent.Device
	for i, d := range set.Devices {
		ad := agentDevice(d)
		if d.Block() {
			disk, err := s.AttachDevice(ctx, diskID(r.ID, i), d)
			if err != nil {
				if set.Privileged {
					log.Warn("privileged container: host device skipped", "error", err)
					continue
				}
				return nil, err
			}
			ad.Serial = disk.Serial
			log.Info("host device attached", "device", d.Name(), "disk", disk.ID)
		}
		out = append(out, ad)
	}
	return out, nil
}

// agentDevice is d as the agent creates it in the container.
func agentDevice(d *device.Device) *agent.Device {
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
	return ad
}

// kindError gives err the errdefs kind the task API's edge converts to a
// status code, keeping err's message.
type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

func withKind(kind, err error) error { return &kindError{kind: kind, err: err} }
