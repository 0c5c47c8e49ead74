package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/state"
)

// makeCgroup creates the pod's cgroup (the sandbox spec's cgroupsPath) in
// every hierarchy, all recorded (in one save) before the first is made,
// and returns its directories, which QEMU joins once started. Its missing
// parents are made but not recorded: like runc, Hull removes only the
// cgroup it was given (kubelet owns the pod's parent cgroup).
func makeCgroup(rec *state.Handle, cgroupsPath string) ([]string, error) {
	rel, err := cgroup.Path(cgroupsPath)
	if err != nil {
		return nil, err
	}
	hs, err := cgroup.Hierarchies()
	if err != nil {
		return nil, fmt.Errorf("creating the pod cgroup %s: %w", cgroupsPath, err)
	}
	rs := make([]state.Resource, len(hs))
	dirs := make([]string, len(hs))
	for i, h := range hs {
		dirs[i] = h.Dir(rel)
		rs[i] = state.Resource{Kind: state.KindCgroup, Key: dirs[i]}
	}
	if err := rec.RecordAll(rs...); err != nil {
		return nil, err
	}
	for i, h := range hs {
		if err := cgroup.Create(h, rel); err != nil {
			// The cgroups not tried are not this sandbox's to remove, nor
			// one that exists already (someone else's): never release them.
			notMade := rs[i+1:]
			if errors.Is(err, fs.ErrExist) {
				notMade = rs[i:]
			}
			for _, r := range notMade {
				if ferr := rec.Forget(r.Kind, r.Key); ferr != nil {
					err = errors.Join(err, ferr)
				}
			}
			return nil, err
		}
	}
	return dirs, nil
}

// shimOrigin holds this process's cgroups from before it joined its
// pod's (joinPod); Release moves it back there before the pod cgroup is
// removed, which would fail while a process is in it.
var shimOrigin struct {
	mu   sync.Mutex
	dirs []string
}

// joinPod moves this process (the shim serving the pod) into the pod's
// cgroup dirs (Kata's sandbox_cgroup_only: the shim too), so that QEMU,
// which it forks next, starts there. Its own cgroups are kept for
// leavePod first.
func joinPod(dirs []string) error {
	hs, err := cgroup.Hierarchies()
	if err != nil {
		return err
	}
	orig, err := cgroup.Of(hs, os.Getpid())
	if err != nil {
		return fmt.Errorf("reading the shim's cgroups: %w", err)
	}
	if len(orig) != len(dirs) {
		return fmt.Errorf("the shim is in %d cgroup hierarchies, the pod cgroup in %d", len(orig), len(dirs))
	}
	shimOrigin.mu.Lock()
	defer shimOrigin.mu.Unlock()
	if shimOrigin.dirs == nil {
		shimOrigin.dirs = orig
	}
	return cgroup.Join(dirs, os.Getpid())
}

// leavePod moves this process back to the cgroups it had before joinPod;
// nothing when it never joined one (a `shim delete` process, hull gc).
func leavePod() error {
	shimOrigin.mu.Lock()
	defer shimOrigin.mu.Unlock()
	if shimOrigin.dirs == nil {
		return nil
	}
	if err := cgroup.Join(shimOrigin.dirs, os.Getpid()); err != nil {
		return fmt.Errorf("moving the shim out of its pod's cgroup: %w", err)
	}
	shimOrigin.dirs = nil
	return nil
}
