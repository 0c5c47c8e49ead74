package sandbox

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/state"
)

// makeCgroup records the pod cgroup in every hierarchy and creates it;
// the release path removes it. A cgroup that exists already is refused
// and not left in the record (it is not the sandbox's to remove); a
// systemd-form path is refused before anything is recorded.
func TestMakeCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	hs, err := cgroup.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	top := "/hull-sandbox-test-" + filepath.Base(t.TempDir())
	t.Cleanup(func() {
		for _, h := range hs {
			state.ReleaseCgroup(context.Background(), state.Resource{Kind: state.KindCgroup, Key: h.Dir(top)})
		}
	})
	store := &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	recorded := func(h *state.Handle) []string {
		var keys []string
		for _, r := range h.State().Resources {
			if r.Kind == state.KindCgroup {
				keys = append(keys, r.Key)
			}
		}
		return keys
	}

	h, err := store.Create("sb1", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := makeCgroup(h, top+"/pod1/sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != len(hs) || strings.Join(recorded(h), " ") != strings.Join(dirs, " ") {
		t.Errorf("made %v, recorded %v; want one per hierarchy (%d)", dirs, recorded(h), len(hs))
	}

	// A second sandbox given the same path: refused, nothing recorded.
	h2, err := store.Create("sb2", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := makeCgroup(h2, top+"/pod1/sb1"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("existing cgroup: %v, want ErrExist", err)
	}
	if r := recorded(h2); len(r) != 0 {
		t.Errorf("existing cgroup left in the record: %v", r)
	}
	if err := Release(context.Background(), h2, ""); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("the other sandbox's release touched %s: %v", d, err)
		}
	}

	if err := Release(context.Background(), h, ""); err != nil {
		t.Fatal(err)
	}
	checkReleased(t, dirs)

	h3, err := store.Create("sb3", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	// A systemd-form path (the systemd cgroup driver's) is the unit's
	// directory under its slice, made and released the same way.
	sdirs, err := makeCgroup(h3, "hulltest.slice:cri-containerd:sb3")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range sdirs {
		if !strings.HasSuffix(d, "/hulltest.slice/cri-containerd-sb3.scope") {
			t.Errorf("systemd path made %s", d)
		}
		if _, err := os.Stat(d); err != nil {
			t.Errorf("systemd path: %v", err)
		}
	}
	if r := recorded(h3); len(r) != len(sdirs) {
		t.Errorf("systemd path recorded %v, made %v", r, sdirs)
	}
	if err := Release(context.Background(), h3, ""); err != nil {
		t.Fatal(err)
	}
	checkReleased(t, sdirs)
	for _, d := range sdirs {
		os.Remove(filepath.Dir(d)) // the slice the test made
	}
}

// checkReleased fails t for each of dirs still there.
func checkReleased(t *testing.T, dirs []string) {
	t.Helper()
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there after the release: %v", d, err)
		}
	}
}

// A pod cgroup that exists already in one hierarchy only (the last, so
// that makeCgroup has made it in the others first): refused; the ones made
// stay recorded and are released, the existing one is neither recorded
// nor touched by the release.
func TestMakeCgroupExistingInOneHierarchy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	hs, err := cgroup.Hierarchies()
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) < 2 {
		t.Skipf("needs two cgroup hierarchies or more, this host has %d", len(hs))
	}
	top := "/hull-sandbox-test-" + filepath.Base(t.TempDir())
	rel := top + "/pod/sb"
	t.Cleanup(func() {
		for _, h := range hs {
			for _, d := range []string{rel, top + "/pod", top} {
				state.ReleaseCgroup(context.Background(), state.Resource{Kind: state.KindCgroup, Key: h.Dir(d)})
			}
		}
	})
	last := hs[len(hs)-1]
	if err := cgroup.Create(last, rel); err != nil {
		t.Fatal(err)
	}
	store := &state.Store{Root: filepath.Join(t.TempDir(), "run")}
	h, err := store.Create("sb", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := makeCgroup(h, rel); !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), last.Dir(rel)) {
		t.Fatalf("makeCgroup: %v, want ErrExist naming %s", err, last.Dir(rel))
	}
	var got []string
	for _, r := range h.State().Resources {
		got = append(got, r.Key)
	}
	var want []string
	for _, hh := range hs[:len(hs)-1] {
		want = append(want, hh.Dir(rel))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("recorded %v, want the cgroups made (%v)", got, want)
	}
	if err := Release(context.Background(), h, ""); err != nil {
		t.Fatal(err)
	}
	checkReleased(t, want)
	if _, err := os.Stat(last.Dir(rel)); err != nil {
		t.Errorf("the cgroup that existed before was removed: %v", err)
	}
}
