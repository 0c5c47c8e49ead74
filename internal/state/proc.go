package state

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/mountinfo"
)

// ProcessStartTime returns field 22 of /proc/<pid>/stat: the time the
// process started, in clock ticks after boot. Together with the pid it
// names a process for good, as a pid alone is reused.
func ProcessStartTime(pid int) (uint64, error) {
	_, start, err := procStat(pid)
	return start, err
}

// ProcessAlive says whether pid is a running (not zombie) process that
// started at startTime.
func ProcessAlive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	state, start, err := procStat(pid)
	return err == nil && start == startTime && !gone(state)
}

// gone says whether a process in this /proc state has exited: a zombie
// waits only for its parent to reap it.
func gone(state byte) bool { return state == 'Z' || state == 'X' || state == 'x' }

// procStat returns the state (field 3) and start time (field 22) of pid.
// The error matches fs.ErrNotExist when there is no such process.
func procStat(pid int) (byte, uint64, error) {
	if pid <= 0 {
		return 0, 0, fmt.Errorf("invalid pid %d", pid)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	return readStat(pid, f)
}

// readStat reads and parses /proc/<pid>/stat from f. A process reaped
// after f was opened makes the read fail with ESRCH: it is reported as
// fs.ErrNotExist, as a process that was gone before the open is.
func readStat(pid int, file *os.File) (byte, uint64, error) {
	b, err := io.ReadAll(file)
	if errors.Is(err, unix.ESRCH) {
		return 0, 0, fmt.Errorf("%w: %w", err, fs.ErrNotExist)
	}
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) is in parentheses and may contain
	// anything, parentheses included; the fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parsing /proc/%d/stat: start time: %w", pid, err)
	}
	return f[0][0], start, nil
}

// mountsUnder returns the mount points at or below path (already
// resolved).
func mountsUnder(path string) ([]string, error) {
	ms, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	return mountinfo.Under(ms, path), nil
}
