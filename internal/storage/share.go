package storage

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
	"github.com/hull-runtime/hull/internal/state"
)

// The sandbox directory's two views of one tree (docs/security.md):
const (
	// TreeName is the host's private tree (<sandbox dir>/tree), where
	// the shim makes containers' directories and binds. QEMU never sees
	// it.
	TreeName = "tree"
	// ShareName is what QEMU exports (<sandbox dir>/shared): a bind of
	// the tree whose own mount is read-only, a slave of the tree so that
	// every bind made in the tree appears in it. The guest can write
	// only inside those binds (rootfs, volumes), never the structure.
	ShareName = "shared"
)

// MakeShare creates a sandbox's tree and its exported view in sandboxDir,
// recording each directory and mount first (anchored at sandboxDir):
//
//	mkdir tree shared
//	mount --bind tree tree && mount --make-shared tree
//	mount --bind -o ro tree shared && mount --make-slave shared
//
// all through descriptors. Releasing the two mounts (lazily) detaches
// everything ever bound below them.
func MakeShare(rec Recorder, sandboxDir string) error {
	tree := filepath.Join(sandboxDir, TreeName)
	shared := filepath.Join(sandboxDir, ShareName)
	for _, d := range []string{tree, shared} {
		if err := rec.Record(state.Anchored(DirResource("", d), sandboxDir)); err != nil {
			return err
		}
		fd, err := hostfs.MkdirAll(sandboxDir, filepath.Base(d), 0o700)
		if err != nil {
			return fmt.Errorf("creating the shared directory: %w", err)
		}
		unix.Close(fd)
	}
	treeMnt, err := bindSelf(rec, sandboxDir, TreeName, TreeName, false)
	if err != nil {
		return err
	}
	defer unix.Close(treeMnt)
	if err := hostfs.SetPropagation(treeMnt, unix.MS_SHARED); err != nil {
		return fmt.Errorf("sharing %s: %w", tree, err)
	}
	view, err := bindSelf(rec, sandboxDir, TreeName, ShareName, true)
	if err != nil {
		return err
	}
	defer unix.Close(view)
	if err := hostfs.SetPropagation(view, unix.MS_SLAVE); err != nil {
		return fmt.Errorf("making %s a slave of %s: %w", shared, tree, err)
	}
	return nil
}

// bindSelf binds sandboxDir/src on sandboxDir/dst (both names in
// sandboxDir): recursively, private, from src's own mount when view is
// false; as one non-recursive read-only clone that stays in src's peer
// group when view is true. It returns the new mount's descriptor.
func bindSelf(rec Recorder, sandboxDir, src, dst string, view bool) (int, error) {
	target := filepath.Join(sandboxDir, dst)
	res := state.Anchored(MountResource("", target), sandboxDir)
	if err := rec.Record(res); err != nil {
		return -1, err
	}
	afd, err := hostfs.OpenAnchor(sandboxDir)
	if err != nil {
		return -1, err
	}
	defer unix.Close(afd)
	sfd, err := hostfs.OpenAt(afd, src, unix.O_PATH|unix.O_DIRECTORY, false)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", filepath.Join(sandboxDir, src), err)
	}
	defer unix.Close(sfd)
	tfd, err := hostfs.OpenAt(afd, dst, unix.O_PATH|unix.O_DIRECTORY, true)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", target, err)
	}
	defer unix.Close(tfd)
	var mfd int
	if view {
		// mount --bind SRC <detached> (a clone of a shared mount is its peer),
		// read-only before it is attached anywhere (and so propagated)
		mfd, err = unix.OpenTree(sfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		if err == nil {
			if err = hostfs.SetReadOnly(mfd); err != nil {
				unix.Close(mfd)
			}
		}
	} else {
		mfd, err = hostfs.Clone(sfd, hostfs.BindOptions{})
	}
	if err != nil {
		return -1, fmt.Errorf("binding %s: %w", target, err)
	}
	if err := hostfs.Attach(mfd, tfd); err != nil {
		unix.Close(mfd)
		return -1, fmt.Errorf("binding %s: %w", target, err)
	}
	if err := recordIdentity(rec, res, mfd); err != nil {
		unix.Close(mfd)
		return -1, err
	}
	return mfd, nil
}
