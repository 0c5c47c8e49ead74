package container

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

// DefaultPauseDir is where the guest image puts Hull's pause
// (guest/pause/pause.c, internal/guestimage's PauseDir): a directory that
// holds only the binary and is the sandbox process's root.
const DefaultPauseDir = "/usr/lib/hull-pause"

// pauseBinary is the pause's path inside its directory.
const pauseBinary = "/pause"

// isSandbox says whether a spec is a CRI pod's sandbox container.
func isSandbox(s *specs.Spec) bool {
	return s.Annotations[annotationContainerType] == "sandbox"
}

// preparePause makes the pause directory a read-only mount of its own,
// so that neither the sandbox process nor a container that reaches its
// root through /proc/PID/root can change it. A guest image without the
// pause is not an error: sandboxes then run their image's command.
func preparePause(dir string) (bool, error) {
	if dir == "" {
		return false, nil
	}
	if _, err := os.Stat(filepath.Join(dir, pauseBinary)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("finding the pause: %w", err)
	}
	// mount --bind DIR DIR && mount -o remount,bind,ro,nosuid,nodev DIR
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("binding the pause directory %s: %w", dir, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", dir, "", flags, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return false, fmt.Errorf("making the pause directory %s read-only: %w", dir, err)
	}
	return true, nil
}

// createPause starts a sandbox container's process: Hull's pause, not the
// sandbox image's command (docs/sandbox.md). Its namespaces are new
// mount, pid, ipc and uts ones; the pause itself makes the read-only pause
// directory its root, becomes the spec's user and drops every capability
// (guest/pause/pause.c). c's storages and cgroup are made; u undoes them.
func (m *Manager) createPause(c *Container, s *specs.Spec, stdin bool, u *undo) (pid int, retErr error) {
	pio, err := newProcIO(false, stdin, c.ptmx)
	if err != nil {
		return 0, err
	}
	startR, startW, err := os.Pipe()
	if err != nil {
		pio.closeAll()
		return 0, fmt.Errorf("creating start pipe: %w", err)
	}
	syncR, syncW, err := os.Pipe()
	if err != nil {
		pio.closeAll()
		startR.Close()
		startW.Close()
		return 0, fmt.Errorf("creating sync pipe: %w", err)
	}
	cgFD, err := c.cgroup.Open()
	if err != nil {
		pio.closeAll()
		startR.Close()
		startW.Close()
		syncR.Close()
		syncW.Close()
		return 0, fmt.Errorf("opening cgroup: %w", err)
	}
	user := s.Process.User
	args := []string{pauseBinary, strconv.FormatUint(uint64(user.UID), 10), strconv.FormatUint(uint64(user.GID), 10)}
	for _, g := range user.AdditionalGids {
		args = append(args, strconv.FormatUint(uint64(g), 10))
	}
	attr := &syscall.ProcAttr{
		Dir:   m.cfg.PauseDir,
		Env:   []string{},
		Files: append(pio.fds(), startR.Fd(), syncW.Fd()),
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
			UseCgroupFD: true,
			CgroupFD:    int(cgFD.Fd()),
			Setsid:      true,
		},
	}
	pid, exits, err := m.forkIn(nil, filepath.Join(m.cfg.PauseDir, pauseBinary), args, attr)
	cgFD.Close()
	startR.Close()
	syncW.Close()
	pio.closeChild()
	if err != nil {
		pio.closeAll()
		startW.Close()
		syncR.Close()
		return 0, fmt.Errorf("starting the sandbox's pause: %w", err)
	}
	proc := newProcess("", pid, false, pio, exits, nil)
	u.push(func() error {
		unix.Kill(proc.Pid, unix.SIGKILL)
		<-proc.done
		proc.release()
		startW.Close()
		syncR.Close()
		return nil
	})
	sync := bufio.NewReader(syncR)
	if err := pauseReady(sync); err != nil {
		return 0, fmt.Errorf("creating the sandbox's pause: %w", err)
	}
	if adj := s.Process.OOMScoreAdj; adj != nil {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/oom_score_adj", pid), []byte(strconv.Itoa(*adj)), 0o644); err != nil {
			return 0, fmt.Errorf("setting the pause's oom_score_adj to %d: %w", *adj, err)
		}
	}
	nsFDs, err := openNamespaces(pid, "pid", "uts", "ipc")
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	c.init, c.startW, c.sync, c.syncR, c.nsFDs = proc, startW, sync, syncR, nsFDs
	c.pause, c.ready = true, true
	c.mu.Unlock()
	c.log.Info("sandbox container created: Hull's pause", "pid", pid)
	return pid, nil
}

// pauseReady reads the pause's first word on the sync pipe: a NUL byte
// once it waits to start, else why it failed.
func pauseReady(r *bufio.Reader) error {
	b, err := r.ReadByte()
	if err == io.EOF {
		return errors.New("the pause exited before it was ready")
	}
	if err != nil {
		return fmt.Errorf("reading the pause's sync pipe: %w", err)
	}
	if b == 0 {
		return nil
	}
	r.UnreadByte()
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	return errors.New(string(msg))
}

// openNamespaces opens the named namespaces of a process.
func openNamespaces(pid int, names ...string) (map[string]*os.File, error) {
	fds := map[string]*os.File{}
	for _, ns := range names {
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			for _, f := range fds {
				f.Close()
			}
			return nil, fmt.Errorf("opening %s namespace of pid %d: %w", ns, pid, err)
		}
		fds[ns] = f
	}
	return fds, nil
}

// errPauseExec refuses an exec into a sandbox that runs Hull's pause: its
// root holds nothing but the pause.
func errPauseExec(id string) error {
	return fmt.Errorf("container %q is a pod sandbox running Hull's pause, which has nothing to exec: %w", id, errdefs.ErrFailedPrecondition)
}
