package cgroup

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestStatsFromFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"cpu.stat":       "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 0\n",
		"memory.current": "1048576\n",
		"memory.max":     "max\n",
		"memory.stat":    "anon 100\ninactive_file 4096\nactive_file 8192\n",
		"memory.events":  "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n",
		"pids.current":   "3\n",
		"pids.max":       "100\n",
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := (&Cgroup{Path: dir}).Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{
		CPUUsageNs: 1500000, CPUUserNs: 1000000, CPUSystemNs: 500000,
		MemoryUsage: 1048576, MemoryLimit: 0, MemoryWorkingSet: 1048576 - 4096,
		PidsCurrent: 3, PidsLimit: 100, OOMKills: 1,
	}
	if s != want {
		t.Fatalf("got %+v\nwant %+v", s, want)
	}
}

func TestStatsMissingControllers(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cpu.stat"), []byte("usage_usec 7\n"), 0o644)
	s, err := (&Cgroup{Path: dir}).Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.CPUUsageNs != 7000 || s.MemoryUsage != 0 {
		t.Fatalf("got %+v", s)
	}
}

func TestStatsBadValue(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("lots\n"), 0o644)
	if _, err := (&Cgroup{Path: dir}).Stats(); err == nil {
		t.Fatal("malformed memory.current accepted")
	}
}

func TestResourceWrites(t *testing.T) {
	limit := int64(64 << 20)
	quota := int64(50000)
	period := uint64(100000)
	shares := uint64(1024)
	pids := int64(20)
	got := ResourceWrites(&specs.LinuxResources{
		Memory: &specs.LinuxMemory{Limit: &limit},
		CPU:    &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period},
		Pids:   &specs.LinuxPids{Limit: &pids},
	})
	want := [][2]string{
		{"memory.max", "67108864"},
		{"cpu.weight", "39"},
		{"cpu.max", "50000 100000"},
		{"pids.max", "20"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	unlimited := int64(-1)
	got = ResourceWrites(&specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &unlimited}, CPU: &specs.LinuxCPU{Quota: &unlimited}})
	want = [][2]string{{"memory.max", "max"}, {"cpu.max", "max 100000"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

func TestApplyAndEnable(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cgroup.controllers"), []byte("cpu pids\n"), 0o644)
	if err := EnableControllers(dir, Controllers); err != nil {
		t.Fatal(err)
	}
	// A plain file keeps only the last write: pids, the last available.
	if data, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); string(data) != "+pids" {
		t.Fatalf("subtree_control %q", data)
	}
	// Enabled controllers are not written again.
	os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("cpu pids\n"), 0o644)
	if err := EnableControllers(dir, Controllers); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); string(data) != "cpu pids\n" {
		t.Fatalf("subtree_control with cpu and pids enabled became %q", data)
	}
	pids := int64(5)
	if err := (&Cgroup{Path: dir}).Apply(&specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &pids}}); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "pids.max")); string(data) != "5" {
		t.Fatalf("pids.max %q", data)
	}
}
