package state

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	return &Store{Root: t.TempDir()}
}

func mustCreate(t *testing.T, s *Store, id string) *Handle {
	t.Helper()
	h, err := s.Create(id, Sandbox{Namespace: "k8s.io", Bundle: "/b/" + id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCreateWritesStateAndDefaults(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb1")
	st := h.State()
	if st.Version != SchemaVersion || st.ID != "sb1" || st.Phase != PhaseCreating || st.Created.IsZero() {
		t.Fatalf("state = %+v", st)
	}
	if st.ShimPid != os.Getpid() || !ProcessAlive(st.ShimPid, st.ShimStartTime) {
		t.Fatalf("owner = %d/%d, want this process", st.ShimPid, st.ShimStartTime)
	}
	info, err := os.Stat(s.Dir("sb1"))
	if err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("dir: %v %v", info, err)
	}
	var onDisk Sandbox
	if err := json.Unmarshal(readFile(t, filepath.Join(s.Dir("sb1"), "state.json")), &onDisk); err != nil {
		t.Fatal(err)
	}
	if onDisk.ID != "sb1" || onDisk.Namespace != "k8s.io" || onDisk.Resources == nil {
		t.Fatalf("on disk: %+v", onDisk)
	}
	if _, err := s.Create("sb1", Sandbox{}); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want ErrExist", err)
	}
	ents, _ := os.ReadDir(s.Root)
	if len(ents) != 1 {
		t.Fatalf("root holds %d entries, want only sb1", len(ents))
	}
}

func TestCreateRejectsBadIDs(t *testing.T) {
	s := newStore(t)
	for _, id := range []string{"", ".", "..", "a/b", ".hidden", "x y"} {
		if _, err := s.Create(id, Sandbox{}); err == nil {
			t.Errorf("Create(%q) succeeded", id)
		}
	}
}

func TestRecordIsOnDiskBeforeItReturns(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	dir := filepath.Join(s.Root, "sb", "shared")
	if err := h.Record(Resource{Kind: KindDir, Key: dir}); err != nil {
		t.Fatal(err)
	}
	// Another reader (hull ps, or this process after a crash) sees it
	// before the caller goes on to acquire the directory.
	list, err := s.List()
	if err != nil || len(list) != 1 || len(list[0].Resources) != 1 || list[0].Resources[0].Key != dir {
		t.Fatalf("List = %+v, %v", list, err)
	}
	// Recording the same kind and key replaces in place.
	if err := h.Record(Resource{Kind: KindFile, Key: "/x/f"}); err != nil {
		t.Fatal(err)
	}
	if err := h.Record(Resource{Kind: KindDir, Key: dir, Data: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	rs := h.State().Resources
	if len(rs) != 2 || rs[0].Kind != KindDir || rs[0].Data["k"] != "v" || rs[1].Kind != KindFile {
		t.Fatalf("resources = %+v", rs)
	}
	if err := h.Forget(KindFile, "/x/f"); err != nil {
		t.Fatal(err)
	}
	if err := h.Forget(KindFile, "/x/f"); err != nil {
		t.Fatalf("forgetting twice: %v", err)
	}
	if n := len(h.State().Resources); n != 1 {
		t.Fatalf("%d resources after Forget", n)
	}
}

func TestRecordValidates(t *testing.T) {
	h := mustCreate(t, newStore(t), "sb")
	for _, r := range []Resource{
		{Kind: KindDir},
		{Key: "x"},
		{Kind: KindDir, Key: "relative"},
		{Kind: KindMount, Key: "/a/../b"},
		{Kind: KindDir, Key: "/"},
		{Kind: KindProcess, Key: "qemu", Pid: 42}, // no start time
	} {
		if err := h.Record(r); err == nil {
			t.Errorf("Record(%+v) succeeded", r)
		}
	}
	if n := len(h.State().Resources); n != 0 {
		t.Fatalf("%d resources recorded", n)
	}
}

// RecordAll records several resources in one save, replacing the one of
// the same kind and key in place; one invalid resource records none of
// them, and a failed save leaves the state as it was.
func TestRecordAllIsOneSave(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	if err := h.Record(Resource{Kind: KindFile, Key: "/f"}); err != nil {
		t.Fatal(err)
	}
	saves := 0
	s.failSave = func(step string) error {
		if step == "write" {
			saves++
		}
		return nil
	}
	err := h.RecordAll(
		Resource{Kind: KindCgroup, Key: "/sys/fs/cgroup/cpu/pod"},
		Resource{Kind: KindFile, Key: "/f", Data: map[string]string{"k": "v"}},
		Resource{Kind: KindCgroup, Key: "/sys/fs/cgroup/memory/pod"},
	)
	if err != nil {
		t.Fatal(err)
	}
	if saves != 1 {
		t.Errorf("RecordAll of 3 saved %d times, want 1", saves)
	}
	var got []string
	for _, r := range h.State().Resources {
		got = append(got, r.String()+" "+r.Data["k"])
	}
	want := "file /f v|cgroup /sys/fs/cgroup/cpu/pod |cgroup /sys/fs/cgroup/memory/pod "
	if strings.Join(got, "|") != want {
		t.Errorf("recorded %q, want %q", strings.Join(got, "|"), want)
	}
	onDisk, err := s.List()
	if err != nil || len(onDisk) != 1 || len(onDisk[0].Resources) != 3 {
		t.Fatalf("on disk: %+v, %v", onDisk, err)
	}

	saves = 0
	err = h.RecordAll(Resource{Kind: KindDir, Key: "/d"}, Resource{Kind: KindDir, Key: "relative"})
	if err == nil || !strings.Contains(err.Error(), "relative") {
		t.Errorf("an invalid resource among several: %v, want an error naming it", err)
	}
	if saves != 0 || len(h.State().Resources) != 3 {
		t.Errorf("an invalid resource among several: %d saves, %d resources; want none recorded", saves, len(h.State().Resources))
	}

	injected := errors.New("injected")
	s.failSave = func(step string) error {
		if step == "rename" {
			return injected
		}
		return nil
	}
	err = h.RecordAll(Resource{Kind: KindDir, Key: "/d"}, Resource{Kind: KindDir, Key: "/e"})
	if !errors.Is(err, injected) || !strings.HasPrefix(err.Error(), "recording dir /d, dir /e in sandbox sb: ") {
		t.Errorf("failed save: %v, want the injected error naming both resources", err)
	}
	if n := len(h.State().Resources); n != 3 {
		t.Errorf("failed save: %d resources in memory, want the 3 before", n)
	}
}

func TestStateReturnsACopy(t *testing.T) {
	h := mustCreate(t, newStore(t), "sb")
	if err := h.Record(Resource{Kind: KindFile, Key: "/f", Data: map[string]string{"a": "1"}}); err != nil {
		t.Fatal(err)
	}
	st := h.State()
	st.Resources[0].Data["a"] = "changed"
	st.Resources[0].Key = "/g"
	if r := h.State().Resources[0]; r.Key != "/f" || r.Data["a"] != "1" {
		t.Fatalf("State shares memory with the handle: %+v", r)
	}
}

func TestFailedSaveKeepsPreviousState(t *testing.T) {
	for _, step := range []string{"write", "sync", "rename"} {
		t.Run(step, func(t *testing.T) {
			s := newStore(t)
			h := mustCreate(t, s, "sb")
			if err := h.Record(Resource{Kind: KindFile, Key: "/first"}); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(s.Dir("sb"), "state.json")
			before := readFile(t, path)
			injected := errors.New("injected")
			s.failSave = func(st string) error {
				if st == step {
					return injected
				}
				return nil
			}
			err := h.Record(Resource{Kind: KindFile, Key: "/second"})
			if !errors.Is(err, injected) {
				t.Fatalf("Record: %v, want the injected error", err)
			}
			if !strings.HasPrefix(err.Error(), "recording file /second in sandbox sb: saving state: ") {
				t.Fatalf("error does not say what failed: %v", err)
			}
			if after := readFile(t, path); string(after) != string(before) {
				t.Fatalf("state file changed:\n%s\nwant\n%s", after, before)
			}
			if rs := h.State().Resources; len(rs) != 1 {
				t.Fatalf("in-memory state took the failed change: %+v", rs)
			}
			if tmps, _ := filepath.Glob(filepath.Join(s.Dir("sb"), ".state-*")); len(tmps) != 0 {
				t.Fatalf("temp files left: %v", tmps)
			}
			s.failSave = nil
			if err := h.Record(Resource{Kind: KindFile, Key: "/second"}); err != nil {
				t.Fatalf("Record after the fault: %v", err)
			}
		})
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	s := newStore(t)
	s.failSave = func(string) error { return errors.New("injected") }
	if _, err := s.Create("sb", Sandbox{}); err == nil {
		t.Fatal("Create succeeded")
	}
	if ents, _ := os.ReadDir(s.Root); len(ents) != 0 {
		t.Fatalf("Create left %v", ents)
	}
}

func TestNewerVersionIsRefused(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	h.Close()
	path := filepath.Join(s.Dir("sb"), "state.json")
	b := strings.Replace(string(readFile(t, path)), `"version": 1`, `"version": 7`, 1)
	if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := s.Open("sb")
	if !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), "schema version 7") {
		t.Fatalf("Open: %v, want an error naming version 7", err)
	}
	list, err := s.List()
	if len(list) != 0 || !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), "sandbox sb:") {
		t.Fatalf("List = %v, %v", list, err)
	}
	if err := os.WriteFile(path, []byte(`{"id":"sb"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("sb"); err == nil || errors.Is(err, ErrNewerVersion) {
		t.Fatalf("Open of a file without version: %v", err)
	}
}

func TestOpenWaitsForTheLock(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := s.OpenContext(ctx, "sb"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("OpenContext while locked: %v", err)
	}
	opened := make(chan *Handle)
	go func() {
		h2, err := s.Open("sb")
		if err != nil {
			t.Error(err)
		}
		opened <- h2
	}()
	if err := h.Record(Resource{Kind: KindFile, Key: "/f"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-opened:
		t.Fatal("Open did not wait for Close")
	case <-time.After(50 * time.Millisecond):
	}
	h.Close()
	h2 := <-opened
	defer h2.Close()
	if rs := h2.State().Resources; len(rs) != 1 {
		t.Fatalf("second handle read %+v", rs)
	}
	if err := h.Record(Resource{Kind: KindFile, Key: "/g"}); err == nil {
		t.Fatal("Record on a closed handle succeeded")
	}
}

func TestOpenAfterReleaseIsNotExist(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	waiting := make(chan error)
	go func() {
		h2, err := s.Open("sb")
		if err == nil {
			h2.Close()
		}
		waiting <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := Release(context.Background(), h, "", BuiltinReleasers()); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if err := <-waiting; !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open that waited for a Release: %v, want ErrNotExist", err)
	}
	if _, err := s.Open("sb"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open after Release: %v", err)
	}
}

func TestConcurrentRecordsOnOneHandle(t *testing.T) {
	h := mustCreate(t, newStore(t), "sb")
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if err := h.Record(Resource{Kind: KindFile, Key: "/f/" + string(rune('a'+i))}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := len(h.State().Resources); n != 20 {
		t.Fatalf("%d resources, want 20", n)
	}
}

func TestUpdateKeepsIdentity(t *testing.T) {
	s := newStore(t)
	h := mustCreate(t, s, "sb")
	if err := h.Update(func(st *Sandbox) { st.ID, st.Version, st.Phase = "other", 9, PhaseRunning }); err != nil {
		t.Fatal(err)
	}
	if st := h.State(); st.ID != "sb" || st.Version != SchemaVersion || st.Phase != PhaseRunning {
		t.Fatalf("state = %+v", st)
	}
}

func TestListSkipsWorkInProgressAndSorts(t *testing.T) {
	s := newStore(t)
	mustCreate(t, s, "b")
	mustCreate(t, s, "a")
	if err := os.Mkdir(filepath.Join(s.Root, ".creating-c-1"), 0o700); err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != "b" || list[1].ID != "a" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if list, err := (&Store{Root: filepath.Join(s.Root, "missing")}).List(); err != nil || len(list) != 0 {
		t.Fatalf("List of a missing root = %v, %v", list, err)
	}
}

func TestSweepRemovesOldLeftovers(t *testing.T) {
	s := newStore(t)
	old := filepath.Join(s.Root, ".removing-x-1")
	fresh := filepath.Join(s.Root, ".creating-y-2")
	for _, d := range []string{old, fresh} {
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	removed, err := s.Sweep()
	if err != nil || len(removed) != 1 || removed[0] != old {
		t.Fatalf("Sweep = %v, %v", removed, err)
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatalf("Sweep removed a fresh directory: %v", err)
	}
}

func TestProcessStartTime(t *testing.T) {
	a, err := ProcessStartTime(os.Getpid())
	if err != nil || a == 0 {
		t.Fatalf("ProcessStartTime = %d, %v", a, err)
	}
	if b, _ := ProcessStartTime(os.Getppid()); b > a {
		t.Fatalf("parent started after us: %d > %d", b, a)
	}
	if _, err := ProcessStartTime(1 << 30); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing pid: %v", err)
	}
	if ProcessAlive(os.Getpid(), a+1) {
		t.Fatal("ProcessAlive ignores the start time")
	}
}

// Ids become path components: only containerd's identifiers pass.
func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"c1": true, "a.b_c-d": true, strings.Repeat("a", 76): true,
		"": false, ".": false, "..": false, "-x": false, "a/b": false, "../x": false, strings.Repeat("a", 77): false, "a b": false,
	} {
		if err := ValidID(id); (err == nil) != ok {
			t.Errorf("ValidID(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}
