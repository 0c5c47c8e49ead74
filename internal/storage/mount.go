package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/mount"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
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
// container ("" for the sandbox). Callers anchor it (state.Anchored) at
// the trusted directory it is made beneath.
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
	if err := rec.Record(state.Anchored(MountResource(container, target), filepath.Dir(target))); err != nil {
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
// sandbox's private tree (tree/<id>), under which every bind of the
// container is made, so that removing it is the last step of releasing
// them. Created with mkdirat beneath the tree: anything already at that
// name other than a directory is an error naming it.
func MakeContainerDir(rec Recorder, treeDir, container string) error {
	if err := state.ValidID(container); err != nil {
		return err
	}
	dir := ContainerDir(treeDir, container)
	if err := rec.Record(state.Anchored(DirResource(container, dir), treeDir)); err != nil {
		return err
	}
	fd, err := hostfs.MkdirAll(treeDir, container, 0o711)
	if err != nil {
		return fmt.Errorf("creating container directory: %w", err)
	}
	unix.Close(fd)
	return nil
}

// BindInto bind-mounts source (a file or directory) on target, a path in
// the sandbox's private tree treeDir, creating the mount point beneath
// it; the mount is recorded for container first, and again with its
// identity once made. The source is opened once and checked
// (hostfs.OpenSource: no symlink, no kernel filesystem, not the host's
// /dev); the bind is a recursive copy of it made from that descriptor
// (open_tree), nosuid, nodev and private (a slave with o.Slave),
// read-only as o asks (ReadOnly: the top mount, as runc's "ro";
// RecursiveReadOnly: every mount, "rro") before it is attached, and moved
// onto the mount point's descriptor (move_mount). The tree's shared view
// (MakeShare) receives it by propagation.
func BindInto(rec Recorder, container, treeDir, source, target string, o hostfs.BindOptions) error {
	rel, err := hostfs.Rel(treeDir, target)
	if err != nil {
		return fmt.Errorf("bind mount target: %w", err)
	}
	srcfd, err := hostfs.OpenSource(source)
	if err != nil {
		return err
	}
	defer unix.Close(srcfd)
	var st unix.Stat_t
	if err := unix.Fstat(srcfd, &st); err != nil {
		return fmt.Errorf("bind mount source %s: %w", source, err)
	}
	res := state.Anchored(MountResource(container, target), treeDir)
	if err := rec.Record(res); err != nil {
		return err
	}
	tfd, err := mountPoint(treeDir, rel, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	if err != nil {
		return fmt.Errorf("creating bind mount point %s: %w", target, err)
	}
	defer unix.Close(tfd)
	mfd, err := hostfs.Clone(srcfd, o)
	if err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", source, target, err)
	}
	defer unix.Close(mfd)
	if err := hostfs.Attach(mfd, tfd); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", source, target, err)
	}
	return recordIdentity(rec, res, mfd)
}

// recordIdentity records res again with the identity of the mount mfd.
func recordIdentity(rec Recorder, res state.Resource, mfd int) error {
	id, _, err := hostfs.MountIdentity(mfd)
	if err != nil {
		return fmt.Errorf("identifying mount %s: %w", res.Path, err)
	}
	return rec.Record(state.WithMountIdentity(res, id))
}

// mountPoint creates (or finds) the mount point rel beneath treeDir, a
// directory or an empty file, and returns an O_PATH descriptor of it.
// Nothing already mounted there, no symlink in the way.
func mountPoint(treeDir, rel string, dir bool) (int, error) {
	pfd, err := hostfs.MkdirAll(treeDir, filepath.Dir(rel), 0o711)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	name := filepath.Base(rel)
	if dir {
		// mkdir NAME (relative to the parent's descriptor)
		err = unix.Mkdirat(pfd, name, 0o755)
	} else {
		var fd int
		if fd, err = hostfs.OpenAt(pfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, true); err == nil {
			unix.Close(fd)
		}
	}
	if err != nil && err != unix.EEXIST {
		return -1, err
	}
	flags := unix.O_PATH
	if dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := hostfs.OpenAt(pfd, name, flags, true)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || !dir && st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, fmt.Errorf("not a regular file (mode %#o): %w", st.Mode, unix.EEXIST)
	}
	return fd, nil
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
