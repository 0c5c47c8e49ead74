package leakcheck

import (
	"os"
	"os/exec"
	"path/filepath"
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
