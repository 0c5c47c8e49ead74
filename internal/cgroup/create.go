package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Dir is the directory of the cgroup rel (from Path) in h.
func (h Hierarchy) Dir(rel string) string { return filepath.Join(h.Mount, rel) }

// Create makes the cgroup rel in h: its missing parents (left in place
// afterwards, as runc does), then the cgroup itself, which must not exist
// yet: an existing cgroup is not this sandbox's to remove. The error then
// wraps fs.ErrExist.
func Create(h Hierarchy, rel string) error {
	dir := h.Mount
	comps := strings.Split(strings.Trim(rel, "/"), "/")
	for i, c := range comps {
		dir = filepath.Join(dir, c)
		leaf := i == len(comps)-1
		// mkdir DIR
		err := os.Mkdir(dir, 0o755)
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrExist) && !leaf:
			continue
		case errors.Is(err, fs.ErrExist):
			return fmt.Errorf("creating cgroup %s: %w (not made by this sandbox)", dir, err)
		default:
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if h.Cpuset {
			if err := inheritCpuset(dir); err != nil {
				return err
			}
		}
	}
	return nil
}

// inheritCpuset gives a new v1 cpuset cgroup its parent's CPUs and memory
// nodes: it starts with none, and no process could join it.
func inheritCpuset(dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if len(bytes.TrimSpace(cur)) > 0 {
			continue
		}
		parent, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		// cat ../cpuset.cpus > cpuset.cpus
		if err := os.WriteFile(filepath.Join(dir, f), parent, 0); err != nil {
			return fmt.Errorf("creating cgroup %s: setting %s: %w", dir, f, err)
		}
	}
	return nil
}

// Join moves process pid, all its threads, into each of dirs:
// echo PID > DIR/cgroup.procs.
func Join(dirs []string, pid int) error {
	for _, d := range dirs {
		p := filepath.Join(d, "cgroup.procs")
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("moving pid %d into cgroup %s: %w", pid, d, err)
		}
	}
	return nil
}

// Contains reports whether pid is in the cgroup dir (its cgroup.procs).
func Contains(dir string, pid int) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return false, err
	}
	for _, f := range strings.Fields(string(b)) {
		if f == strconv.Itoa(pid) {
			return true, nil
		}
	}
	return false, nil
}

// Of returns the cgroup directories of process pid in hs, in the same
// order, from /proc/<pid>/cgroup ("N:controllers:/path"; "0::/path" for
// v2).
func Of(hs []Hierarchy, pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return nil, err
	}
	return parseProcCgroup(hs, string(b), pid)
}

func parseProcCgroup(hs []Hierarchy, text string, pid int) ([]string, error) {
	paths := map[string]string{} // controllers ("" for v2) -> path
	for _, l := range strings.Split(text, "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) == 3 {
			paths[f[1]] = f[2]
		}
	}
	dirs := make([]string, len(hs))
	for i, h := range hs {
		key := h.Controllers
		if h.V2 {
			key = ""
		}
		p, ok := paths[key]
		if !ok {
			return nil, fmt.Errorf("pid %d has no cgroup in %s", pid, h.Mount)
		}
		dirs[i] = h.Dir(p)
	}
	return dirs, nil
}
