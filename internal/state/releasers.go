package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// processWait is how long ReleaseProcess waits for a killed process to
// exit.
var processWait = 5 * time.Second

// ReleaseProcess kills the process r.Pid with SIGKILL and waits (up to
// 5 s, or until ctx is done) until it has exited; a zombie counts as
// exited, since only its parent can reap it. A process that is not
// running, or whose start time is not r.StartTime (the pid was reused), is
// already released: it is never signalled. Pid 0 means the process was
// recorded but never started.
func ReleaseProcess(ctx context.Context, r Resource) error {
	if r.Pid <= 0 {
		return nil
	}
	if r.StartTime == 0 {
		return fmt.Errorf("pid %d has no recorded start time: refusing to signal a pid that may have been reused", r.Pid)
	}
	// A pidfd pins the process: once its start time is checked through
	// /proc, the signal cannot reach a process that reused the pid.
	pidfd, err := unix.PidfdOpen(r.Pid, 0)
	switch {
	case err == unix.ESRCH:
		return nil
	case err != nil:
		pidfd = -1 // no pidfd (kernel < 5.3): fall back to kill(2)
	default:
		defer unix.Close(pidfd)
	}
	state, start, err := procStat(r.Pid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if start != r.StartTime || gone(state) {
		return nil
	}
	if pidfd >= 0 {
		err = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	} else {
		err = unix.Kill(r.Pid, unix.SIGKILL)
	}
	if err == unix.ESRCH {
		return nil
	}
	if err != nil {
		return fmt.Errorf("killing pid %d: %w", r.Pid, err)
	}
	return waitExit(ctx, r.Pid, r.StartTime, pidfd)
}

// waitExit waits until the process has exited (or is a zombie): on the
// pidfd, which becomes readable when it exits, or by looking at /proc
// every 10 ms without one.
func waitExit(ctx context.Context, pid int, startTime uint64, pidfd int) error {
	deadline := time.Now().Add(processWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		if !ProcessAlive(pid, startTime) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return fmt.Errorf("pid %d still running after SIGKILL", pid)
		}
		if pidfd >= 0 {
			// Wake up at least every 100 ms to notice ctx being cancelled.
			fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
			_, err := unix.Poll(fds, int(min(left, 100*time.Millisecond)/time.Millisecond)+1)
			if err != nil && err != unix.EINTR {
				return fmt.Errorf("waiting for pid %d: %w", pid, err)
			}
			continue
		}
		time.Sleep(min(left, 10*time.Millisecond))
	}
}

// resolve returns path with symlinks resolved, or ok=false when it does
// not exist.
func resolve(path string) (string, bool, error) {
	p, err := filepath.EvalSymlinks(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	return p, true, nil
}

// ReleaseMount unmounts r's path (lazily, MNT_DETACH) as many times as
// something is mounted there, for stacked mounts. A path that is not a
// mount point, or does not exist, is released.
func ReleaseMount(_ context.Context, r Resource) error {
	p, ok, err := resolve(r.path())
	if err != nil {
		// A dead FUSE mount (virtiofsd killed) fails lstat with ENOTCONN:
		// it is still a mount point, at the path as recorded.
		p, ok = r.path(), true
	}
	if !ok {
		return nil
	}
	for range 64 {
		mounted, err := isMountPoint(p)
		if err != nil || !mounted {
			return err
		}
		// umount -l PATH
		err = unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
	return fmt.Errorf("%s is still mounted after 64 unmounts", p)
}

// ReleaseDir removes r's path and everything in it, unless a mount lies
// at or under it: deleting through a lingering bind mount would delete a
// user's data, so that is an error naming the mount (release the mount
// first; Release does, being newest first).
func ReleaseDir(_ context.Context, r Resource) error {
	p, ok, err := resolve(r.path())
	if err != nil || !ok {
		return err
	}
	if err := checkNoMounts(p); err != nil {
		return err
	}
	return os.RemoveAll(p)
}

// checkNoMounts fails when a mount lies at or under the resolved path.
func checkNoMounts(path string) error {
	p, ok, err := resolve(path)
	if err != nil || !ok {
		return err
	}
	mps, err := mountsUnder(p)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("refusing to remove %s: %s is mounted under it", p, strings.Join(mps, ", "))
	}
	return nil
}

// ReleaseFile removes a file or socket; one that does not exist is
// released.
func ReleaseFile(_ context.Context, r Resource) error {
	err := os.Remove(r.path())
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// ReleaseCgroup removes a cgroup v2 directory and the (empty) cgroups
// below it, deepest first. A cgroup that still has processes fails with
// an error saying so; one that does not exist is released.
func ReleaseCgroup(_ context.Context, r Resource) error {
	return rmdirCgroup(r.path())
}

func rmdirCgroup(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := rmdirCgroup(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	// rmdir DIR (a cgroup's interface files go with it)
	err = unix.Rmdir(dir)
	switch {
	case err == nil || err == unix.ENOENT:
		return nil
	case err == unix.EBUSY:
		procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		return fmt.Errorf("cgroup %s is busy (%d processes in it)", dir, len(strings.Fields(string(procs))))
	default:
		return fmt.Errorf("removing cgroup %s: %w", dir, err)
	}
}
