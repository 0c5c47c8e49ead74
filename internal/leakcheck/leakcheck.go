// Package leakcheck lets a test assert that nothing it started outlives
// it: no process, mount or file that names one of the test's paths.
package leakcheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/mountinfo"
)

// settle is how long processes get to go away after a test.
const settle = 5 * time.Second

// Register makes t fail at cleanup if any process whose command line
// contains one of paths is still running, if any mount lies under one of
// them, or if a path that is a directory is not empty (paths that do not
// exist are fine). Register it before the test acquires anything, so it
// runs after the test's own cleanups.
func Register(t testing.TB, paths ...string) {
	t.Helper()
	t.Cleanup(func() {
		t.Helper()
		for _, err := range Leaks(paths, settle) {
			t.Errorf("leak: %v", err)
		}
	})
}

// Leaks returns what is left of paths, waiting up to wait for processes
// to exit.
func Leaks(paths []string, wait time.Duration) []error {
	var errs []error
	deadline := time.Now().Add(wait)
	for {
		procs := Processes(paths)
		if len(procs) == 0 || time.Now().After(deadline) {
			for _, p := range procs {
				errs = append(errs, fmt.Errorf("process %d still running: %s", p.Pid, p.Cmdline))
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, m := range Mounts(paths) {
		errs = append(errs, fmt.Errorf("mount still present: %s", m))
	}
	for _, p := range paths {
		entries, err := os.ReadDir(p)
		if err != nil {
			continue
		}
		for _, e := range entries {
			errs = append(errs, fmt.Errorf("file left behind: %s", filepath.Join(p, e.Name())))
		}
	}
	return errs
}

// Process is a running process.
type Process struct {
	Pid     int
	Cmdline string
}

// Processes lists the processes whose command line contains one of
// paths, and the QEMUs whose working directory does: a QEMU runs in its
// VM's directory (an empty one of that name in its own root), but its
// arguments need not name it (its sockets are descriptors).
func Processes(paths []string) []Process {
	dirs, _ := os.ReadDir("/proc")
	var out []Process
	self := os.Getpid()
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := string(bytes.ReplaceAll(bytes.TrimRight(b, "\x00"), []byte{0}, []byte{' '}))
		if stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat")); err == nil && isZombie(stat) {
			continue
		}
		match := cmd
		if IsQEMU(cmd) {
			if cwd, err := os.Readlink(filepath.Join("/proc", d.Name(), "cwd")); err == nil {
				match += " " + cwd
			}
		}
		for _, p := range paths {
			if strings.Contains(match, p) {
				out = append(out, Process{Pid: pid, Cmdline: cmd})
				break
			}
		}
	}
	return out
}

// IsQEMU tells whether a command line (as Process.Cmdline) runs QEMU.
func IsQEMU(cmdline string) bool {
	f := strings.Fields(cmdline)
	return len(f) > 0 && strings.Contains(f[0], "qemu-system")
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// Mounts lists the mount points under one of paths.
func Mounts(paths []string) []string {
	ms, err := mountinfo.Read()
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range paths {
		out = append(out, mountinfo.Under(ms, p)...)
	}
	return out
}
