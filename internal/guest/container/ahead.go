package container

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/guest/nsinit"
	"github.com/hull-runtime/hull/internal/guest/reaper"
)

// The helper started ahead (docs/performance.md, "The helper started
// ahead"). A container's helper is the agent's binary executed again: in
// a VM restored from a template its exec and the Go runtime's start are
// code no process of that VM has run yet, which TCG translates afresh
// (60–90 ms of the first container's create). So Prepare starts one
// helper before the agent serves, which a template keeps waiting: the
// first container whose namespaces it can take (a pid namespace of its
// own, no terminal, no namespace to join) gets it instead of a new one.

// aheadWait bounds how long Prepare waits for the helper to say it waits.
const aheadWait = 10 * time.Second

// helperAhead is a started helper waiting for its container.
type helperAhead struct {
	pid   int
	exits <-chan reaper.Exit
	// sock is the agent's end of the socket pair on the helper's ConfigFD.
	sock *os.File
}

// startAhead starts the helper and waits until it says it waits; one
// already waiting is kept.
func (m *Manager) startAhead() error {
	m.mu.Lock()
	waiting := m.ahead != nil
	m.mu.Unlock()
	if waiting {
		return nil
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket pair for the helper started ahead: %w", err)
	}
	// the agent's end non-blocking, so that its read has a deadline
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return fmt.Errorf("socket pair for the helper started ahead: %w", err)
	}
	sock := os.NewFile(uintptr(fds[0]), "helper-ahead")
	child := os.NewFile(uintptr(fds[1]), "helper-ahead-child")
	defer child.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		sock.Close()
		return err
	}
	defer null.Close()
	n := null.Fd()
	attr := &syscall.ProcAttr{
		Files: []uintptr{n, n, n, child.Fd(), n, n},
		Sys:   &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWPID, Setsid: true},
	}
	pid, exits, err := m.forkIn(nil, m.cfg.Self, []string{"hull-init", nsinit.Arg, nsinit.ModeAhead}, attr)
	if err != nil {
		sock.Close()
		return fmt.Errorf("starting the helper ahead: %w", err)
	}
	h := &helperAhead{pid: pid, exits: exits, sock: sock}
	sock.SetReadDeadline(time.Now().Add(aheadWait))
	var b [1]byte
	if _, err := io.ReadFull(sock, b[:]); err != nil {
		h.discard()
		return fmt.Errorf("the helper started ahead did not say it waits: %w", err)
	}
	sock.SetReadDeadline(time.Time{})
	m.mu.Lock()
	m.ahead = h
	m.mu.Unlock()
	return nil
}

// takeAhead returns the waiting helper, nil if there is none or it has
// exited; the Manager no longer holds it.
func (m *Manager) takeAhead() *helperAhead {
	m.mu.Lock()
	h := m.ahead
	m.ahead = nil
	m.mu.Unlock()
	if h == nil {
		return nil
	}
	select {
	case e := <-h.exits:
		m.cfg.Log.Warn("the helper started ahead had exited; starting one", "pid", h.pid, "status", e.Status)
		h.sock.Close()
		return nil
	default:
		return h
	}
}

// DiscardAhead ends the waiting helper, if any.
func (m *Manager) DiscardAhead() {
	if h := m.takeAhead(); h != nil {
		h.discard()
	}
}

// discard kills the helper and waits for the reaper to collect it.
func (h *helperAhead) discard() {
	unix.Kill(h.pid, unix.SIGKILL)
	<-h.exits
	h.sock.Close()
}

// canTakeAhead says whether a container with these namespaces can use a
// helper started ahead: born in a pid namespace of its own, it can unshare
// the others on its thread, but not join a pod's pid namespace, make a
// network namespace (a thread's alone would not be the container's for
// its sockets' lifetime guarantees) or take a terminal as its controlling
// one.
func canTakeAhead(flags uintptr, join []nsJoin, terminal bool) bool {
	return flags&unix.CLONE_NEWPID != 0 && flags&unix.CLONE_NEWNET == 0 && len(join) == 0 && !terminal
}

// handOver moves the helper into the container's cgroup and gives it
// files (fds 0 to 5 of a created helper); the helper is then the
// container's init, reaped through h.exits. On an error the helper is
// gone and nothing was given.
func (h *helperAhead) handOver(cgroupDir *os.File, files []uintptr) error {
	err := h.give(cgroupDir, files)
	if err != nil {
		h.discard()
		return err
	}
	h.sock.Close()
	return nil
}

func (h *helperAhead) give(cgroupDir *os.File, files []uintptr) error {
	if len(files) != nsinit.AheadFDs {
		return fmt.Errorf("handing %d descriptors to the helper started ahead, want %d", len(files), nsinit.AheadFDs)
	}
	// echo PID > CGROUP/cgroup.procs
	procs, err := unix.Openat(int(cgroupDir.Fd()), "cgroup.procs", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("moving the helper started ahead into the container's cgroup: %w", err)
	}
	_, err = unix.Write(procs, []byte(strconv.Itoa(h.pid)))
	unix.Close(procs)
	if err != nil {
		return fmt.Errorf("moving the helper started ahead into the container's cgroup: %w", err)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f)
	}
	raw, err := h.sock.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	err = raw.Write(func(fd uintptr) bool {
		sendErr = unix.Sendmsg(int(fd), []byte{0}, unix.UnixRights(fds...), nil, 0)
		return !errors.Is(sendErr, unix.EAGAIN)
	})
	if err == nil {
		err = sendErr
	}
	if err != nil {
		return fmt.Errorf("handing descriptors to the helper started ahead: %w", err)
	}
	return nil
}
