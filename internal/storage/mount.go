package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/mount"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

// Recorder records a resource in the sandbox's state before it is
// acquired (a *state.Handle). Every function here calls it first and
// acquires nothing when it fails; releasing is state.Release's job, with
// the default releasers (mount: lazy unmount; dir: removal that refuses
// to cross a mount).
type Recorder interface {
	Record(state.Resource) error
}

// MountResource is the record of a mount the shim makes on target for
// container ("" for the sandbox).
func MountResource(container, target string) state.Resource {
	return state.Resource{Kind: state.KindMount, Key: target, Path: target, Container: container}
}

// DirResource is the record of a directory the shim creates (and removes
// with everything in it) for container.
func DirResource(container, dir string) state.Resource {
	return state.Resource{Kind: state.KindDir, Key: dir, Path: dir, Container: container}
}

// MountRootfs mounts the rootfs containerd passed in CreateTaskRequest on
// target (<bundle>/rootfs), as runc's shim does, recording the mount for
// container first. With no mounts the bundle's rootfs is already in
// place and nothing is recorded.
func MountRootfs(rec Recorder, container string, mounts []*types.Mount, target string) error {
	if len(mounts) == 0 {
		return nil
	}
	var ms []mount.Mount
	for _, m := range mounts {
		ms = append(ms, mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	if err := rec.Record(MountResource(container, target)); err != nil {
		return err
	}
	// The bundle (and so the mount point) is containerd's: it is not
	// recorded, and containerd removes it with the bundle.
	if err := os.MkdirAll(target, 0o711); err != nil {
		return fmt.Errorf("creating rootfs mount point %s: %w", target, err)
	}
	if err := mount.All(ms, target); err != nil {
		return fmt.Errorf("mounting rootfs on %s: %w", target, err)
	}
	return nil
}

// MakeContainerDir records and creates container's directory in the
// shared directory (shared/<id>), under which every bind of the container
// is made, so that removing it is the last step of releasing them.
func MakeContainerDir(rec Recorder, sharedDir, container string) error {
	dir := ContainerDir(sharedDir, container)
	if err := rec.Record(DirResource(container, dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	return nil
}

// BindInto bind-mounts source (a file or directory) on target inside the
// container's directory in the shared directory, creating the mount
// point; the mount is recorded for container first. Recursive, so that
// the guest sees what is mounted below source too.
func BindInto(rec Recorder, container, source, target string, readOnly bool) error {
	st, err := os.Stat(source)
	if err != nil {
		return fmt.Errorf("bind mount source: %w", err)
	}
	if err := rec.Record(MountResource(container, target)); err != nil {
		return err
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

// Unmount removes every mount at or below target (lazily when busy). A
// missing target is not an error. `shim delete` uses it on
// <bundle>/rootfs as runc's shim does, behind the release of what the
// state recorded: containerd's bundle must never keep a mount.
func Unmount(target string) error {
	if _, err := os.Lstat(target); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := mount.UnmountRecursive(target, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	return nil
}
