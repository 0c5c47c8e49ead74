package sandbox

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/state"
)

// makeCgroup creates the pod's cgroup (the sandbox spec's cgroupsPath) in
// every hierarchy, each recorded before it is made, and returns its
// directories, which QEMU joins once started. Its missing parents are
// made but not recorded: like runc, Hull removes only the cgroup it was
// given (kubelet owns the pod's parent cgroup).
func makeCgroup(rec *state.Handle, cgroupsPath string) ([]string, error) {
	rel, err := cgroup.Path(cgroupsPath)
	if err != nil {
		return nil, err
	}
	hs, err := cgroup.Hierarchies()
	if err != nil {
		return nil, fmt.Errorf("creating the pod cgroup %s: %w", cgroupsPath, err)
	}
	var dirs []string
	for _, h := range hs {
		r := state.Resource{Kind: state.KindCgroup, Key: h.Dir(rel)}
		if err := rec.Record(r); err != nil {
			return nil, err
		}
		if err := cgroup.Create(h, rel); err != nil {
			if errors.Is(err, fs.ErrExist) {
				// Someone else's: never release it.
				if ferr := rec.Forget(r.Kind, r.Key); ferr != nil {
					err = errors.Join(err, ferr)
				}
			}
			return nil, err
		}
		dirs = append(dirs, r.Key)
	}
	return dirs, nil
}
