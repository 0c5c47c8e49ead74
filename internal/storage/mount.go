package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/mount"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Recorder is told about each host mount before it is made, so that the
// one release path can undo it after a crash.
type Recorder interface {
	RecordMount(target string) error
}

// MountRootfs mounts the rootfs containerd passed in CreateTaskRequest on
// target (<bundle>/rootfs), as runc's shim does. With no mounts the
// bundle's rootfs is already in place.
func MountRootfs(rec Recorder, mounts []*types.Mount, target string) error {
	if len(mounts) == 0 {
		return nil
	}
	var ms []mount.Mount
	for _, m := range mounts {
		ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	if err := os.MkdirAll(target, 0o711); err != nil {
		return fmt.Errorf("creating rootfs mount point %s: %w", target, err)
	}
	if err := rec.RecordMount(target); err != nil {
		return err
	}
	if err := mount.All(ms, target); err != nil {
		return fmt.Errorf("mounting rootfs on %s: %w", target, err)
	}
	return nil
}

// BindInto bind-mounts source (a file or directory) on target inside the
// shared directory, creating the mount point. Recursive, so that the
// guest sees what is mounted below source too.
func BindInto(rec Recorder, source, target string, readOnly bool) error {
	st, err := os.Stat(source)
	if err != nil {
		return fmt.Errorf("bind mount source: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o711); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(target), err)
	}
	if st.IsDir() {
		err = os.Mkdir(target, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
			err = f.Close()
		}
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating bind mount point %s: %w", target, err)
	}
	if err := rec.RecordMount(target); err != nil {
		return err
	}
	// mount --rbind SOURCE TARGET
	if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", source, target, err)
	}
	// Keep host mounts made later under source from propagating into the
	// share, and the share's from propagating back:
	// mount --make-rprivate TARGET
	if err := unix.Mount("", target, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("making %s private: %w", target, err)
	}
	if readOnly {
		// mount -o remount,bind,ro TARGET
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remounting %s read-only: %w", target, err)
		}
	}
	return nil
}

// Unmount removes every mount at or below target (lazily when busy) and
// then target itself when it is an empty directory or a file. A missing
// target is not an error: release is idempotent.
func Unmount(target string) error {
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := mount.UnmountRecursive(target, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	return nil
}

// RemoveContainerDir unmounts everything under a container's directory in
// the shared directory and removes it.
func RemoveContainerDir(sharedDir, containerID string) error {
	dir := ContainerDir(sharedDir, containerID)
	if err := Unmount(dir); err != nil {
		return err
	}
	// Nothing is mounted below dir any more, so RemoveAll cannot reach
	// into a container's rootfs or a volume.
	left, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("checking mounts under %s: %w", dir, err)
	}
	if len(left) > 0 {
		return fmt.Errorf("removing %s: %s is still mounted", dir, left[0].Mountpoint)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}
