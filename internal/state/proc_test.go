package state

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// A process reaped between the open of /proc/<pid>/stat and its read
// (the kernel then fails the read with ESRCH) is gone, as one reaped
// before the open is: ReleaseProcess racing its parent's wait must not
// fail.
func TestReadStatOfAProcessReapedAfterTheOpenIsNotExist(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Process.Kill()
	cmd.Wait() // reaped: the open file now names no process

	_, _, err = readStat(pid, f)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("reading the stat of reaped pid %d: %v, want an error matching fs.ErrNotExist", pid, err)
	}
}
