package state

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/hostfs"
)

// A Releaser frees one resource of its kind. It must be idempotent and
// treat a resource that does not exist (recorded but never acquired, or
// released before) as released: it returns nil then. It returns an error
// only when the resource may still exist.
type Releaser func(ctx context.Context, r Resource) error

// Releasers maps each kind to its Releaser.
type Releasers map[Kind]Releaser

// With returns a copy of rs with the entries of other added (other wins).
func (rs Releasers) With(other Releasers) Releasers {
	out := maps.Clone(rs)
	if out == nil {
		out = Releasers{}
	}
	maps.Copy(out, other)
	return out
}

// BuiltinReleasers returns the releasers of the kinds this package
// releases itself: process, mount, dir, file, socket, cgroup. The other
// kinds' come from the packages that own them, gathered in one place
// (internal/releasers).
func BuiltinReleasers() Releasers {
	return Releasers{
		KindProcess: ReleaseProcess,
		KindMount:   ReleaseMount,
		KindDir:     ReleaseDir,
		KindFile:    ReleaseFile,
		KindSocket:  ReleaseFile,
		KindCgroup:  ReleaseCgroup,
	}
}

// ReleaseOrder returns the resources Release would release, in the order
// it would release them: newest first, only container's when container is
// not "".
func ReleaseOrder(s Sandbox, container string) []Resource {
	var out []Resource
	for _, r := range slices.Backward(s.Resources) {
		if container == "" || r.Container == container {
			out = append(out, r)
		}
	}
	return out
}

// Release releases every resource recorded in h, newest first, or only
// those of one container when container is not "". Each resource released
// is forgotten (and the state saved) at once, so a Release interrupted by
// a crash resumes where it stopped. A resource that cannot be released
// stays recorded and Release goes on with the others; their errors are
// joined, each naming its resource. Resources that were recorded but
// never acquired count as released (that is the releasers' contract).
//
// Releasing the whole sandbox (container == "") sets the phase to
// PhaseStopping first and, once no resource is left, removes the
// sandbox's directory — refusing to if a mount is still under it — after
// which the Handle only answers State and Close. Calling Release again,
// in this or another process, is a no-op for what is already released.
func Release(ctx context.Context, h *Handle, container string, rs Releasers) error {
	st := h.State()
	if container == "" && st.Phase != PhaseStopping {
		if err := h.SetPhase(PhaseStopping); err != nil {
			if errors.Is(err, ErrReleased) {
				return nil
			}
			return fmt.Errorf("releasing sandbox %s: %w", h.id, err)
		}
	}
	var errs []error
	for _, r := range ReleaseOrder(st, container) {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("releasing sandbox %s: %w", h.id, err))
			break
		}
		fn := rs[r.Kind]
		if fn == nil {
			errs = append(errs, fmt.Errorf("releasing %s: no releaser for kind %q", r, r.Kind))
			continue
		}
		if err := fn(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("releasing %s: %w", r, err))
			continue
		}
		if err := h.Forget(r.Kind, r.Key); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 || container != "" {
		return errors.Join(errs...)
	}
	return h.removeDir()
}

// removeDir removes the sandbox's directory once nothing is recorded. It
// first renames it to a ".removing-" name, so that <Root>/<id> is gone in
// one step and a crash midway leaves something Sweep removes, never a
// sandbox without a state file.
func (h *Handle) removeDir() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	if err := h.usableLocked(); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", h.id, err)
	}
	if n := len(h.st.Resources); n > 0 {
		// Recorded concurrently (by another goroutine using h).
		return fmt.Errorf("removing sandbox %s: %d resources recorded meanwhile", h.id, n)
	}
	if err := checkNoMounts(h.dir); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", h.id, err)
	}
	root := filepath.Dir(h.dir)
	gone := filepath.Join(root, fmt.Sprintf("%s%s-%d", removingPrefix, h.id, time.Now().UnixNano()))
	if err := os.Rename(h.dir, gone); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", h.id, err)
	}
	h.released = true
	h.st.Phase = PhaseReleased
	// A waiting Open now finds no lock file at <Root>/<id> and reports
	// the sandbox as not existing.
	if err := syncDir(root); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", h.id, err)
	}
	if err := hostfs.RemoveAll(root, filepath.Base(gone)); err != nil {
		return fmt.Errorf("removing sandbox %s: %w", h.id, err)
	}
	return nil
}

// sweepAge is how old a ".creating-" or ".removing-" directory must be
// before Sweep takes it for a crash's remains rather than work in progress.
var sweepAge = time.Minute

// Sweep removes what a crash inside Create or Release left in Root:
// directories being created or removed whose lock nobody holds and that
// are older than a minute (and have no mount under them). It returns the
// paths it removed.
func (s *Store) Sweep() ([]string, error) {
	ents, err := os.ReadDir(s.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sweeping %s: %w", s.Root, err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, creatingPrefix) && !strings.HasPrefix(name, removingPrefix) {
			continue
		}
		dir := filepath.Join(s.Root, name)
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < sweepAge || LockBusy(filepath.Join(dir, lockFile)) {
			continue
		}
		if err := checkNoMounts(dir); err != nil {
			errs = append(errs, fmt.Errorf("sweeping %s: %w", dir, err))
			continue
		}
		if err := hostfs.RemoveAll(s.Root, name); err != nil {
			errs = append(errs, fmt.Errorf("sweeping %s: %w", dir, err))
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

// Release opens the sandbox, releases all of it (see the Release
// function) and closes it: what `shim delete` and `hull gc` do. A sandbox
// that does not exist (any more) is released.
func (s *Store) Release(ctx context.Context, id string, rs Releasers) error {
	h, err := s.OpenContext(ctx, id)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer h.Close()
	return Release(ctx, h, "", rs)
}
