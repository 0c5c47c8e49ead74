package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/hull-runtime/hull/internal/state"
)

// Store is the templates' directory of one state root.
type Store struct {
	Dir string
	Log *slog.Logger
}

// NewStore returns the store of the state root stateRoot.
func NewStore(stateRoot string, log *slog.Logger) *Store {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Store{Dir: filepath.Join(stateRoot, DirName), Log: log}
}

func (s *Store) dir(key string) string      { return filepath.Join(s.Dir, key) }
func (s *Store) lockPath(key string) string { return filepath.Join(s.Dir, key+".lock") }
func (s *Store) buildDir(key string) string { return filepath.Join(s.Dir, key+".build") }

// Get returns a clone of the template for shape, building the template
// first when there is none or it is unusable (an unusable one is
// removed, with a warning). Concurrent callers, in any process, build it
// once: the others wait for the build's lock, bounded by ctx.
func (s *Store) Get(ctx context.Context, shape Shape) (*Clone, error) {
	in, err := shape.inputs()
	if err != nil {
		return nil, err
	}
	key := keyOf(shape, in)
	c, err := openClone(s.dir(key), key)
	if err == nil {
		s.used(key)
		return c, nil
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	unlock, err := s.lock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	c, err = openClone(s.dir(key), key)
	if err == nil {
		return c, nil // built while we waited
	}
	if !errors.Is(err, fs.ErrNotExist) {
		s.Log.Warn("VM template unusable; rebuilding it", "template", key, "error", err)
		if err := os.RemoveAll(s.dir(key)); err != nil {
			return nil, fmt.Errorf("removing unusable template %s: %w", key, err)
		}
	}
	if err := s.build(ctx, key, shape, in); err != nil {
		return nil, err
	}
	s.evict(key)
	return openClone(s.dir(key), key)
}

// MaxTemplates bounds the templates a store keeps: each holds the RAM
// its guest touched (≈ 40 MiB, on /run's tmpfs on most hosts), and pods
// of many sizes would each make one. Past it, the least recently used
// go.
const MaxTemplates = 8

// used marks key as used now (its directory's modification time), for
// evict.
func (s *Store) used(key string) {
	now := time.Now()
	os.Chtimes(s.dir(key), now, now)
}

// evict removes the least recently used templates beyond MaxTemplates,
// never keep, and none whose lock is held (a build, or a removal).
// Clones of an evicted template keep running on its unlinked memory.
func (s *Store) evict(keep string) {
	list, err := s.List()
	if err != nil || len(list) <= MaxTemplates {
		return
	}
	type aged struct {
		key  string
		used time.Time
	}
	var all []aged
	for _, in := range list {
		if fi, err := os.Stat(in.Dir); err == nil && in.Key != keep {
			all = append(all, aged{in.Key, fi.ModTime()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used.Before(all[j].used) })
	for _, a := range all[:max(0, len(list)-MaxTemplates)] {
		if state.LockBusy(s.lockPath(a.key)) {
			continue
		}
		if err := os.RemoveAll(s.dir(a.key)); err != nil {
			s.Log.Warn("evicting VM template", "template", a.key, "error", err)
			continue
		}
		os.Remove(s.lockPath(a.key))
		s.Log.Info("evicted the least recently used VM template", "template", a.key, "last_used", a.used)
	}
}

// lock takes key's build lock, waiting until ctx is done.
func (s *Store) lock(ctx context.Context, key string) (func(), error) {
	f, err := os.OpenFile(s.lockPath(key), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("template %s: lock: %w", key, err)
	}
	if err := state.Flock(ctx, f); err != nil {
		f.Close()
		return nil, fmt.Errorf("template %s: waiting for its build lock: %w", key, err)
	}
	return func() { f.Close() }, nil
}

// build builds key's template in its build directory and renames it into
// place; a failed build leaves nothing. The caller holds the lock.
func (s *Store) build(ctx context.Context, key string, shape Shape, in map[string]string) error {
	dir := s.buildDir(key)
	// A build directory without the lock is a build that died.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("template %s: removing an abandoned build: %w", key, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("template %s: %w", key, err)
	}
	start := time.Now()
	m := Meta{Version: Version, Key: key, Shape: shape, Inputs: in, Created: start.UTC()}
	err := buildVM(ctx, dir, key, &m, s.Log)
	if err == nil {
		m.BuildMs = time.Since(start).Milliseconds()
		err = writeMeta(dir, m)
	}
	if err == nil {
		err = os.Rename(dir, s.dir(key))
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("building VM template %s: %w", key, err)
	}
	s.Log.Info("VM template built", "template", key, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// entries lists the store's directory; none when it does not exist yet.
func (s *Store) entries() ([]os.DirEntry, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	return ents, nil
}

// List describes every template, sorted by key.
func (s *Store) List() ([]Info, error) {
	ents, err := s.entries()
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, k := range sortedKeys(ents) {
		out = append(out, info(s.dir(k), k))
	}
	return out, nil
}

// Remove removes the template key (a unique prefix of it will do), under
// its lock: clones that run keep its memory until they exit.
func (s *Store) Remove(ctx context.Context, key string) (string, error) {
	full, err := s.resolve(key)
	if err != nil {
		return "", err
	}
	unlock, err := s.lock(ctx, full)
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := os.RemoveAll(s.dir(full)); err != nil {
		return "", fmt.Errorf("removing template %s: %w", full, err)
	}
	os.Remove(s.lockPath(full))
	return full, nil
}

// resolve finds the one template whose key starts with prefix.
func (s *Store) resolve(prefix string) (string, error) {
	if prefix == "" {
		return "", errors.New("template key is empty")
	}
	ents, err := s.entries()
	if err != nil {
		return "", err
	}
	var match []string
	for _, k := range sortedKeys(ents) {
		if strings.HasPrefix(k, prefix) {
			match = append(match, k)
		}
	}
	switch len(match) {
	case 0:
		return "", fmt.Errorf("template %q: %w", prefix, errNoTemplate)
	case 1:
		return match[0], nil
	}
	return "", fmt.Errorf("template prefix %q matches %d templates", prefix, len(match))
}

// GC removes stale templates (an input file changed or is gone, or the
// template is unusable) and builds abandoned by a process that died. It
// returns what it removed (with dryRun, would remove). A template whose
// build lock is held is left.
func (s *Store) GC(dryRun bool) ([]string, error) {
	ents, err := s.entries()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		key := strings.TrimSuffix(strings.TrimSuffix(name, ".lock"), ".build")
		if !validKey(key) || state.LockBusy(s.lockPath(key)) {
			continue
		}
		stale := false
		switch {
		case name == key+".build":
			stale = true
		case name == key+".lock":
			_, err := os.Stat(s.dir(key))
			stale = errors.Is(err, fs.ErrNotExist)
		case e.IsDir():
			stale = info(s.dir(key), key).Stale
		}
		if !stale {
			continue
		}
		if dryRun {
			removed = append(removed, name)
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.Dir, name)); err != nil {
			errs = append(errs, fmt.Errorf("removing template %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}
