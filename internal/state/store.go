package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/hostfs"
)

const (
	stateFile = "state.json"
	lockFile  = "lock"
	tempGlob  = ".state-*.tmp"

	// Directories being created or removed carry these prefixes; List
	// ignores them and Sweep removes those left by a crash.
	creatingPrefix = ".creating-"
	removingPrefix = ".removing-"
)

// ErrReleased is returned by a Handle whose sandbox Release removed.
var ErrReleased = errors.New("sandbox state was released")

// Store is the directory that holds one subdirectory per sandbox.
//
// Locking: a Handle holds an exclusive flock on <Root>/<id>/lock from
// Create or Open until Close, so everything done through one Handle is one
// transaction as far as other Handles (in this or another process) can
// tell; they block in Open until Close. Readers that only look (List,
// `hull ps`) take no lock. The shim should Open/Close around each
// operation (a task's Create, Delete, ...) rather than for its lifetime,
// so that `shim delete` and `hull gc`, which run in other processes, are
// never blocked by a healthy shim. Within a process, a single Handle may
// be used from several goroutines; two Handles on the same sandbox
// serialise on the flock like two processes do.
type Store struct {
	Root string // default config.DefaultRunDir

	// failSave, when set (by tests), is called at each step of a save
	// ("write", "sync", "rename", "syncdir") and fails it when it returns
	// an error.
	failSave func(step string) error
}

// Dir returns the sandbox's directory, where its sockets and shared
// directories live too.
func (s *Store) Dir(id string) string { return filepath.Join(s.Root, id) }

// Create makes the sandbox's directory, locks it and writes init as its
// first state. ID and Version are set by Create; Phase defaults to
// PhaseCreating, Created to now, and ShimPid (with ShimStartTime) to the
// calling process. It fails with an error matching fs.ErrExist when the
// sandbox exists.
func (s *Store) Create(id string, init Sandbox) (*Handle, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	if init.ID != "" && init.ID != id {
		return nil, fmt.Errorf("creating sandbox %s: state names id %q", id, init.ID)
	}
	st := init.clone()
	st.ID, st.Version = id, SchemaVersion
	if st.Phase == "" {
		st.Phase = PhaseCreating
	}
	if st.Created.IsZero() {
		st.Created = time.Now().UTC()
	}
	if st.ShimPid == 0 {
		st.ShimPid = os.Getpid()
	}
	if st.ShimStartTime == 0 {
		t, err := ProcessStartTime(st.ShimPid)
		if err != nil {
			return nil, fmt.Errorf("creating sandbox %s: owner: %w", id, err)
		}
		st.ShimStartTime = t
	}
	for _, r := range st.Resources {
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
		}
	}

	if err := os.MkdirAll(s.Root, 0o711); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	// The directory is made complete (lock and state) under a temporary
	// name and then renamed into place, so <Root>/<id> never exists
	// without a state file; a crash leaves a ".creating-" directory that
	// List ignores and Sweep removes.
	tmpDir, err := os.MkdirTemp(s.Root, creatingPrefix+id+"-")
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	h, err := s.create(id, tmpDir, st)
	if err != nil {
		hostfs.RemoveAll(s.Root, filepath.Base(tmpDir))
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	return h, nil
}

func (s *Store) create(id, tmpDir string, st Sandbox) (*Handle, error) {
	if err := os.Chmod(tmpDir, 0o700); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(filepath.Join(tmpDir, lockFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := Flock(context.Background(), lock); err != nil {
		lock.Close()
		return nil, err
	}
	h := &Handle{store: s, id: id, dir: tmpDir, lock: lock, st: st}
	if err := h.save(st); err != nil {
		lock.Close()
		return nil, err
	}
	dir := s.Dir(id)
	if err := renameNoReplace(tmpDir, dir); err != nil {
		lock.Close()
		return nil, err
	}
	h.dir = dir
	if err := syncDir(s.Root); err != nil {
		// The sandbox exists; take it away again.
		hostfs.RemoveAll(s.Root, id)
		lock.Close()
		return nil, err
	}
	return h, nil
}

// renameNoReplace renames a directory, failing with an error matching
// fs.ErrExist if newpath exists.
func renameNoReplace(oldpath, newpath string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, unix.RENAME_NOREPLACE)
	if err == unix.EINVAL || err == unix.ENOSYS {
		// The filesystem cannot say; rename(2) would replace an empty
		// directory, so look first (Create's callers use unique ids).
		if _, err := os.Lstat(newpath); err == nil {
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrExist}
		}
		return os.Rename(oldpath, newpath)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

// Open locks the sandbox's state, waiting as long as another Handle holds
// it, and reads it. It fails with an error matching fs.ErrNotExist when
// the sandbox does not exist (or was released while Open waited).
func (s *Store) Open(id string) (*Handle, error) {
	return s.OpenContext(context.Background(), id)
}

// OpenContext is Open giving up when ctx is done.
func (s *Store) OpenContext(ctx context.Context, id string) (*Handle, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	dir := s.Dir(id)
	lock, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening sandbox %s: %w", id, err)
	}
	if err := Flock(ctx, lock); err != nil {
		lock.Close()
		return nil, fmt.Errorf("locking sandbox %s: %w", id, err)
	}
	// Release removes the lock file while holding it; whoever waited on
	// the removed file must not go on as if the sandbox still existed.
	if !sameFile(lock, filepath.Join(dir, lockFile)) {
		lock.Close()
		return nil, fmt.Errorf("opening sandbox %s: %w", id, fs.ErrNotExist)
	}
	st, err := readState(filepath.Join(dir, stateFile))
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("opening sandbox %s: %w", id, err)
	}
	if st.ID != id {
		lock.Close()
		return nil, fmt.Errorf("opening sandbox %s: state file names sandbox %q", id, st.ID)
	}
	return &Handle{store: s, id: id, dir: dir, lock: lock, st: st}, nil
}

// List reads every sandbox's state without locking. Sandboxes that cannot
// be read are left out and reported in the returned error (one joined
// error per sandbox); the others are returned even then, sorted by
// creation time.
func (s *Store) List() ([]Sandbox, error) {
	ents, err := os.ReadDir(s.Root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	var out []Sandbox
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || ValidID(e.Name()) != nil {
			continue
		}
		dir := filepath.Join(s.Root, e.Name())
		st, err := readState(filepath.Join(dir, stateFile))
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox %s: %w", e.Name(), err))
			continue
		}
		out = append(out, st)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, errors.Join(errs...)
}

// Peek reads sandbox id's state without locking, as List does: the file
// is replaced atomically, so what it returns is a state that was saved,
// possibly already stale. `shim delete` uses it to find an owner to stop
// before waiting for the lock that owner may hold for a whole boot.
func (s *Store) Peek(id string) (Sandbox, error) {
	if err := ValidID(id); err != nil {
		return Sandbox{}, err
	}
	return readState(filepath.Join(s.Dir(id), stateFile))
}

// Handle is a locked sandbox state. Close it when done.
type Handle struct {
	store *Store
	id    string
	dir   string

	// mu guards the fields below and serialises saves.
	mu       sync.Mutex
	lock     *os.File // nil once closed
	st       Sandbox  // as last saved
	released bool     // Release removed the directory
}

// ID returns the sandbox id.
func (h *Handle) ID() string { return h.id }

// Dir returns the sandbox's directory.
func (h *Handle) Dir() string { return h.dir }

// Root returns the store's root: the parent of the sandbox's directory.
func (h *Handle) Root() string { return h.store.Root }

// State returns a copy of the state as last saved.
func (h *Handle) State() Sandbox {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st.clone()
}

// Record adds r, or replaces the resource of the same kind and key in
// place, and saves. Call it BEFORE acquiring the resource, and do not
// acquire it if Record fails. A process is recorded twice: with Pid 0
// before it is started, and with its Pid and StartTime right after.
func (h *Handle) Record(r Resource) error { return h.RecordAll(r) }

// RecordAll records each of rs as Record does, in order and in one save:
// all of them or, when it fails, none. It is for resources acquired one
// after another with nothing else between (a cgroup in each hierarchy);
// each save of the state costs a file sync, which is most of a
// millisecond on a disk.
func (h *Handle) RecordAll(rs ...Resource) error {
	if len(rs) == 0 {
		return nil
	}
	names := make([]string, len(rs))
	for i, r := range rs {
		if err := r.validate(); err != nil {
			return fmt.Errorf("recording in sandbox %s: %w", h.id, err)
		}
		names[i] = r.String()
	}
	return h.mutate("recording "+strings.Join(names, ", "), func(s *Sandbox) {
		for _, r := range rs {
			if i := s.find(r.Kind, r.Key); i >= 0 {
				s.Resources[i] = r
			} else {
				s.Resources = append(s.Resources, r)
			}
		}
	})
}

// Forget removes the resource of kind and key (after it was released) and
// saves. Forgetting what is not recorded is not an error.
func (h *Handle) Forget(kind Kind, key string) error {
	return h.mutate(fmt.Sprintf("forgetting %s %s", kind, key), func(s *Sandbox) {
		if i := s.find(kind, key); i >= 0 {
			s.Resources = append(s.Resources[:i], s.Resources[i+1:]...)
		}
	})
}

// SetPhase sets the phase and saves.
func (h *Handle) SetPhase(p string) error {
	return h.mutate("setting phase "+p, func(s *Sandbox) { s.Phase = p })
}

// Update applies fn to a copy of the state and saves it. fn cannot change
// ID or Version; resources it adds are checked as Record checks them.
func (h *Handle) Update(fn func(*Sandbox)) error {
	return h.mutate("updating", func(s *Sandbox) {
		id, v := s.ID, s.Version
		fn(s)
		s.ID, s.Version = id, v
	})
}

// Close unlocks the state. The Handle cannot be used afterwards.
func (h *Handle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lock == nil {
		return nil
	}
	err := h.lock.Close() // closing the last descriptor drops the flock
	h.lock = nil
	return err
}

// mutate applies fn to a copy of the state and saves it; the in-memory
// state changes only when the save succeeded.
func (h *Handle) mutate(what string, fn func(*Sandbox)) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.usableLocked(); err != nil {
		return fmt.Errorf("%s in sandbox %s: %w", what, h.id, err)
	}
	next := h.st.clone()
	fn(&next)
	for _, r := range next.Resources {
		if err := r.validate(); err != nil {
			return fmt.Errorf("%s in sandbox %s: %w", what, h.id, err)
		}
	}
	if next.Resources == nil {
		next.Resources = []Resource{}
	}
	if err := h.save(next); err != nil {
		return fmt.Errorf("%s in sandbox %s: %w", what, h.id, err)
	}
	h.st = next
	return nil
}

// usableLocked says why the Handle cannot be used. h.mu must be held.
func (h *Handle) usableLocked() error {
	switch {
	case h.released:
		return ErrReleased
	case h.lock == nil:
		return errors.New("state handle is closed")
	}
	return nil
}

// save writes st to state.json atomically: a temp file in the same
// directory, fsync, rename over state.json, fsync of the directory. On
// any failure the previous state.json is untouched and the temp file is
// removed. The caller holds the flock (and h.mu, or owns h exclusively).
func (h *Handle) save(st Sandbox) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding state: %w", err)
	}
	b = append(b, '\n')
	fail := func(step string) error {
		if h.store.failSave != nil {
			return h.store.failSave(step)
		}
		return nil
	}
	tmp, err := os.CreateTemp(h.dir, tempGlob)
	if err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fail("write"); err != nil {
		return fmt.Errorf("saving state: writing %s: %w", tmp.Name(), err)
	}
	if _, err := tmp.Write(b); err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	if err := fail("sync"); err != nil {
		return fmt.Errorf("saving state: syncing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	final := filepath.Join(h.dir, stateFile)
	if err := fail("rename"); err != nil {
		return fmt.Errorf("saving state: renaming to %s: %w", final, err)
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	committed = true
	// The new file is in place; a failed directory fsync means it may not
	// survive a power cut, which the caller should hear about.
	if err := fail("syncdir"); err != nil {
		return fmt.Errorf("saving state: syncing %s: %w", h.dir, err)
	}
	if err := syncDir(h.dir); err != nil {
		return fmt.Errorf("saving state: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// readState reads and checks a state file.
func readState(path string) (Sandbox, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Sandbox{}, fmt.Errorf("reading state: %w", err)
	}
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return Sandbox{}, fmt.Errorf("reading state: %s: %w", path, err)
	}
	if v.Version < 1 || v.Version > SchemaVersion {
		return Sandbox{}, fmt.Errorf("reading state: %w", &VersionError{Path: path, Version: v.Version})
	}
	var st Sandbox
	if err := json.Unmarshal(b, &st); err != nil {
		return Sandbox{}, fmt.Errorf("reading state: %s: %w", path, err)
	}
	if st.Resources == nil {
		st.Resources = []Resource{}
	}
	return st, nil
}

// Flock takes an exclusive lock on f, waiting until ctx is done. Without
// a deadline it blocks in the kernel; with one it retries a non-blocking
// lock with a growing pause (at most 50 ms), since a blocked flock cannot
// be interrupted.
func Flock(ctx context.Context, f *os.File) error {
	fd := int(f.Fd())
	if ctx.Done() == nil {
		for {
			err := unix.Flock(fd, unix.LOCK_EX)
			if err != unix.EINTR {
				return err
			}
		}
	}
	pause := time.Millisecond
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// LockBusy says whether someone holds the lock file's flock.
func LockBusy(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	return err == unix.EWOULDBLOCK
}

// sameFile says whether the open file f is still the file at path.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	if err != nil {
		return false
	}
	return os.SameFile(a, b)
}
