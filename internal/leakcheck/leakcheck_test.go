package leakcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestFindsProcessFileAndPassesWhenClean(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "marker-arg")
	// sh holds the marker as $0, so it shows in the command line.
	cmd := exec.Command("sh", "-c", "sleep 30", marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := os.WriteFile(filepath.Join(dir, "left"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	leaks := Leaks([]string{dir}, 200*time.Millisecond)
	if len(leaks) != 2 {
		t.Fatalf("got %d leaks, want the process and the file: %v", len(leaks), leaks)
	}
	cmd.Process.Kill()
	cmd.Wait()
	os.Remove(filepath.Join(dir, "left"))
	if leaks := Leaks([]string{dir}, time.Second); len(leaks) != 0 {
		t.Fatalf("clean dir reported leaks: %v", leaks)
	}
}

// A QEMU is found by its working directory (its VM's), which its
// arguments need not name; another process is not.
func TestFindsQEMUByWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	start := func(argv0 string) *exec.Cmd {
		c := &exec.Cmd{Path: sleep, Args: []string{argv0, "60"}, Dir: dir}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	qemu, other := start("qemu-system-x86_64"), start("sleep")
	var found []int
	for _, p := range Processes([]string{dir}) {
		found = append(found, p.Pid)
	}
	if !slices.Contains(found, qemu.Process.Pid) || slices.Contains(found, other.Process.Pid) {
		t.Errorf("Processes(%s) = %v, want the QEMU %d and not the other process %d", dir, found, qemu.Process.Pid, other.Process.Pid)
	}
}
