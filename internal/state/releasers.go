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

	"github.com/hull-runtime/hull/internal/hostfs"
)

// processWait is how long ReleaseProcess waits for a killed process to
// exit.
var processWait = 5 * time.Second

// ReleaseProcess kills the process r.Pid with SIGKILL and waits (up to
// 5 s, or until ctx is done) until every thread of it has exited (and
// so left its cgroup); a zombie whose threads have all exited counts as
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
	_, start, err := procStat(r.Pid)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if start != r.StartTime || exited(r.Pid, r.StartTime, pidfd) {
		return nil
	}
	// A zombie leader may have threads still running, or still exiting:
	// the signal reaches them, and the wait is for them.
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

// waitExit waits until the process has exited (exited): on the pidfd,
// which becomes readable when its last thread exits, or by looking at
// /proc every 10 ms without one.
func waitExit(ctx context.Context, pid int, startTime uint64, pidfd int) error {
	deadline := time.Now().Add(processWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		if exited(pid, startTime, pidfd) {
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

// exited says whether every thread of the process has exited: its
// pidfd is readable (the kernel's own test), or, without one, it is
// gone from /proc or a zombie with no thread but its leader left.
// The leader's state alone is not enough: it is a zombie as soon as
// its own thread exits, while the others may still be exiting, and
// counted in its cgroup.
func exited(pid int, startTime uint64, pidfd int) bool {
	if pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0
	}
	state, start, err := procStat(pid)
	if err != nil || start != startTime {
		return true // reaped (or the pid reused)
	}
	if !gone(state) {
		return false
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return err != nil || len(ents) <= 1
}

// ReleaseMount releases a mount of the sandbox's tree. A mount recorded
// with its identity (DataMountID) is unmounted (lazily, MNT_DETACH, so
// with everything below it) by that identity: found at its recorded path
// (resolved beneath its anchor, no symlink followed) or, if the guest
// moved it, through /proc/self/mountinfo, and checked by unique id after
// opening; unmounting goes through the descriptor (/proc/self/fd/N), so
// no path is followed between the check and the unmount. A mount that is
// nowhere is released. A record without identity (made before it, or a
// crash between recording and mounting) unmounts what is mounted at its
// path, stacked mounts included.
func ReleaseMount(_ context.Context, r Resource) error {
	id, hasID := r.mountIdentity()
	fd, err := openRecorded(r)
	switch {
	case err == unix.ENOTCONN:
		// A dead FUSE mount (virtiofsd killed): still a mount point, at
		// the path as recorded (host-made: no guest writes above it).
		err = unix.Unmount(r.path(), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmounting %s: %w", r.path(), err)
		}
		return nil
	case err == nil:
		done, err := unmountAtPath(fd, r, id, hasID)
		if done || err != nil {
			return err
		}
	case err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR || err == unix.EXDEV:
		// Not at its path (any more): only an identity can find it.
	default:
		return fmt.Errorf("opening %s: %w", r.path(), err)
	}
	if !hasID {
		return nil
	}
	for range 4 {
		fd, mp, found, err := hostfs.Find(id)
		if err != nil {
			return fmt.Errorf("finding mount %d of %s: %w", id.ID, r.path(), err)
		}
		if !found {
			return nil
		}
		err = hostfs.UnmountFD(fd)
		unix.Close(fd)
		if err != nil && err != unix.EINVAL {
			return fmt.Errorf("unmounting mount %d of %s at %s: %w", id.ID, r.path(), mp, err)
		}
	}
	return fmt.Errorf("mount %d of %s is still mounted after 4 unmounts", id.ID, r.path())
}

// unmountAtPath unmounts the mount at fd (r's recorded path) if it is the
// recorded one (or, with no identity recorded, whatever is mounted
// there, as often as something is). It closes fd; done says the mount is
// released.
func unmountAtPath(fd int, r Resource, id hostfs.Identity, hasID bool) (bool, error) {
	for range 64 {
		got, root, err := hostfs.MountIdentity(fd)
		if err != nil {
			unix.Close(fd)
			return false, fmt.Errorf("checking %s: %w", r.path(), err)
		}
		if hasID && (!root || !id.Same(got)) {
			unix.Close(fd) // something else is there: look by identity
			return false, nil
		}
		if !root {
			unix.Close(fd)
			return true, nil
		}
		err = hostfs.UnmountFD(fd)
		unix.Close(fd)
		if err != nil && err != unix.EINVAL {
			return false, fmt.Errorf("unmounting %s: %w", r.path(), err)
		}
		if hasID {
			return true, nil
		}
		if fd, err = openRecorded(r); err != nil {
			return true, nil
		}
	}
	unix.Close(fd)
	return false, fmt.Errorf("%s is still mounted after 64 unmounts", r.path())
}

// openRecorded opens r's path as an O_PATH descriptor: beneath its anchor
// with no symlink followed when it has one, else with no symlink followed
// anywhere.
func openRecorded(r Resource) (int, error) {
	if a := r.Data[DataAnchor]; a != "" {
		rel, err := hostfs.Rel(a, r.path())
		if err != nil {
			return -1, err
		}
		afd, err := hostfs.OpenAnchor(a)
		if err != nil {
			return -1, unwrapErrno(err)
		}
		defer unix.Close(afd)
		return hostfs.OpenAt(afd, rel, unix.O_PATH, false)
	}
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	return unix.Openat2(unix.AT_FDCWD, r.path(), &how)
}

func unwrapErrno(err error) error {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return err
}

// ReleaseDir removes r's directory and everything in it, beneath its
// anchor and by descriptor (hostfs.RemoveAll): a symlink is unlinked,
// never followed; whatever now has its name (a file, a symlink) is
// removed; a mount at or under it is never removed through, but is an
// error naming it (release the mount first; Release does, being newest
// first).
func ReleaseDir(_ context.Context, r Resource) error {
	a, rel, err := r.anchor()
	if err != nil {
		return err
	}
	return hostfs.RemoveAll(a, rel)
}

// checkNoMounts fails when a mount lies at or under path (a host path,
// taken as it is).
func checkNoMounts(path string) error {
	mps, err := mountsUnder(filepath.Clean(path))
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("refusing to remove %s: %s is mounted under it", path, strings.Join(mps, ", "))
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
