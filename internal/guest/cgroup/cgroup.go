// Package cgroup manages the guest's per-container cgroups (v2): creating
// them under a root, applying OCI resources, reading stats, freezing and
// killing, removing.
package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// DefaultRoot is where the agent creates container cgroups in the guest.
const DefaultRoot = "/sys/fs/cgroup/hull"

// Controllers the agent enables for containers, where the kernel has them.
var Controllers = []string{"cpu", "memory", "pids", "io"}

// EnableControllers enables, in dir's cgroup.subtree_control, those of want
// that dir's cgroup.controllers offers and are not enabled yet.
func EnableControllers(dir string, want []string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("reading controllers of %s: %w", dir, err)
	}
	have := map[string]bool{}
	for _, c := range strings.Fields(string(avail)) {
		have[c] = true
	}
	// A missing file (not a cgroup) enables nothing here; the writes
	// below say why.
	on, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	enabled := strings.Fields(string(on))
	var errs []error
	for _, c := range want {
		if !have[c] || slices.Contains(enabled, c) {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
			errs = append(errs, fmt.Errorf("enabling controller %s in %s: %w", c, dir, err))
		}
	}
	return errors.Join(errs...)
}

// Cgroup is one container's cgroup directory.
type Cgroup struct {
	Path string
}

// PrepareRoot makes root, the parent of the containers' cgroups, and
// enables Controllers in it; done already, it reads two files.
func PrepareRoot(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("creating cgroup root %s: %w", root, err)
	}
	return EnableControllers(root, Controllers)
}

// Create makes root (PrepareRoot) and root/name.
func Create(root, name string) (*Cgroup, error) {
	if name == "" || strings.ContainsAny(name, "/") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup name %q: %w", name, os.ErrInvalid)
	}
	if err := PrepareRoot(root); err != nil {
		return nil, err
	}
	p := filepath.Join(root, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", p, err)
	}
	return &Cgroup{Path: p}, nil
}

// Open returns the cgroup directory, for CLONE_INTO_CGROUP.
func (c *Cgroup) Open() (*os.File, error) {
	return os.OpenFile(c.Path, unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
}

func (c *Cgroup) write(file, value string) error {
	if err := os.WriteFile(filepath.Join(c.Path, file), []byte(value), 0); err != nil {
		return fmt.Errorf("writing %q to %s: %w", value, file, err)
	}
	return nil
}

// SharesToWeight converts cgroup v1 cpu.shares to a v2 cpu.weight.
func SharesToWeight(shares uint64) uint64 {
	if shares == 0 {
		return 0
	}
	if shares < 2 {
		shares = 2
	}
	if shares > 262144 {
		shares = 262144
	}
	return 1 + ((shares-2)*9999)/262142
}

// ResourceWrites translates OCI resources into cgroup v2 file writes, in
// the order they must be applied.
func ResourceWrites(r *specs.LinuxResources) [][2]string {
	if r == nil {
		return nil
	}
	var w [][2]string
	if m := r.Memory; m != nil && m.Limit != nil {
		v := "max"
		if *m.Limit > 0 {
			v = strconv.FormatInt(*m.Limit, 10)
		}
		w = append(w, [2]string{"memory.max", v})
	}
	if c := r.CPU; c != nil {
		if c.Shares != nil && *c.Shares > 0 {
			w = append(w, [2]string{"cpu.weight", strconv.FormatUint(SharesToWeight(*c.Shares), 10)})
		}
		if c.Quota != nil || c.Period != nil {
			quota := "max"
			if c.Quota != nil && *c.Quota > 0 {
				quota = strconv.FormatInt(*c.Quota, 10)
			}
			period := uint64(100000)
			if c.Period != nil && *c.Period > 0 {
				period = *c.Period
			}
			w = append(w, [2]string{"cpu.max", quota + " " + strconv.FormatUint(period, 10)})
		}
	}
	if p := r.Pids; p != nil {
		v := "max"
		if p.Limit != nil && *p.Limit > 0 {
			v = strconv.FormatInt(*p.Limit, 10)
		}
		w = append(w, [2]string{"pids.max", v})
	}
	for k, v := range r.Unified {
		w = append(w, [2]string{k, v})
	}
	return w
}

// Apply writes OCI resources to the cgroup.
func (c *Cgroup) Apply(r *specs.LinuxResources) error {
	for _, kv := range ResourceWrites(r) {
		if err := c.write(kv[0], kv[1]); err != nil {
			return err
		}
	}
	return nil
}

// Procs lists the pids in the cgroup.
func (c *Cgroup) Procs() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(c.Path, "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("reading cgroup.procs: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parsing cgroup.procs: %w", err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// Signal sends sig to every process in the cgroup; SIGKILL uses cgroup.kill
// where the kernel has it.
func (c *Cgroup) Signal(sig unix.Signal) error {
	if sig == unix.SIGKILL {
		if err := c.write("cgroup.kill", "1"); err == nil {
			return nil
		}
	}
	pids, err := c.Procs()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signalling pid %d: %w", pid, err)
		}
	}
	return nil
}

// Freeze freezes (or thaws) the cgroup and waits until the kernel reports
// the new state.
func (c *Cgroup) Freeze(ctx context.Context, frozen bool) error {
	v := "0"
	if frozen {
		v = "1"
	}
	if err := c.write("cgroup.freeze", v); err != nil {
		return err
	}
	for {
		data, err := os.ReadFile(filepath.Join(c.Path, "cgroup.events"))
		if err != nil {
			return fmt.Errorf("reading cgroup.events: %w", err)
		}
		kv := ParseKV(data)
		if strconv.FormatUint(kv["frozen"], 10) == v {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for cgroup.freeze %s: %w", v, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Remove deletes the cgroup, retrying briefly while the kernel still counts
// exiting processes in it. A missing cgroup is not an error.
func (c *Cgroup) Remove() error {
	var err error
	for i := 0; i < 50; i++ {
		err = unix.Rmdir(c.Path)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", c.Path, err)
}

// Stats is what StatsContainer reports. Limits are 0 when unlimited.
type Stats struct {
	CPUUsageNs, CPUUserNs, CPUSystemNs uint64
	MemoryUsage, MemoryLimit           uint64
	MemoryWorkingSet                   uint64
	PidsCurrent, PidsLimit             uint64
	OOMKills                           uint64
}

// Stats reads the cgroup's statistics. Files of controllers the kernel does
// not offer are skipped.
func (c *Cgroup) Stats() (Stats, error) {
	var s Stats
	read := func(name string) ([]byte, bool, error) {
		data, err := os.ReadFile(filepath.Join(c.Path, name))
		if errors.Is(err, os.ErrNotExist) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("reading %s: %w", name, err)
		}
		return data, true, nil
	}
	if data, ok, err := read("cpu.stat"); err != nil {
		return s, err
	} else if ok {
		kv := ParseKV(data)
		s.CPUUsageNs = kv["usage_usec"] * 1000
		s.CPUUserNs = kv["user_usec"] * 1000
		s.CPUSystemNs = kv["system_usec"] * 1000
	}
	single := func(name string, dst *uint64) error {
		data, ok, err := read(name)
		if err != nil || !ok {
			return err
		}
		v, err := ParseValue(data)
		if err != nil {
			return fmt.Errorf("parsing %s: %w", name, err)
		}
		*dst = v
		return nil
	}
	for _, f := range []struct {
		name string
		dst  *uint64
	}{
		{"memory.current", &s.MemoryUsage},
		{"memory.max", &s.MemoryLimit},
		{"pids.current", &s.PidsCurrent},
		{"pids.max", &s.PidsLimit},
	} {
		if err := single(f.name, f.dst); err != nil {
			return s, err
		}
	}
	s.MemoryWorkingSet = s.MemoryUsage
	if data, ok, err := read("memory.stat"); err != nil {
		return s, err
	} else if ok {
		if inactive := ParseKV(data)["inactive_file"]; inactive < s.MemoryUsage {
			s.MemoryWorkingSet = s.MemoryUsage - inactive
		} else {
			s.MemoryWorkingSet = 0
		}
	}
	if data, ok, err := read("memory.events"); err != nil {
		return s, err
	} else if ok {
		s.OOMKills = ParseKV(data)["oom_kill"]
	}
	return s, nil
}

// ParseKV parses "key value" lines (cpu.stat, memory.stat, memory.events,
// cgroup.events). Lines that do not parse are skipped.
func ParseKV(data []byte) map[string]uint64 {
	kv := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		kv[f[0]] = v
	}
	return kv
}

// ParseValue parses a single-value file; "max" is 0 (unlimited).
func ParseValue(data []byte) (uint64, error) {
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, err
	}
	if v == math.MaxUint64 {
		return 0, nil
	}
	return v, nil
}
