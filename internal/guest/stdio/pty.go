package stdio

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a new pseudo-terminal pair from ptmx (normally /dev/ptmx).
func OpenPTY(ptmx string) (master, slave *os.File, err error) {
	m, err := os.OpenFile(ptmx, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("opening %s: %w", ptmx, err)
	}
	fail := func(err error) (*os.File, *os.File, error) {
		m.Close()
		return nil, nil, err
	}
	rc, err := m.SyscallConn()
	if err != nil {
		return fail(err)
	}
	var (
		n     int
		sfd   uintptr
		ioErr error
		errno unix.Errno
	)
	err = rc.Control(func(fd uintptr) {
		if ioErr = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); ioErr != nil {
			ioErr = fmt.Errorf("unlocking pty: %w", ioErr)
			return
		}
		if n, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCGPTN); ioErr != nil {
			ioErr = fmt.Errorf("getting pty number: %w", ioErr)
			return
		}
		// The slave is opened through the master (TIOCGPTPEER) where the
		// kernel supports it, so it is the pts instance of this ptmx even
		// when /dev/pts is mounted elsewhere.
		sfd, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	})
	if err == nil {
		err = ioErr
	}
	if err != nil {
		return fail(err)
	}
	if errno == 0 {
		return m, os.NewFile(sfd, fmt.Sprintf("/dev/pts/%d", n)), nil
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("opening pty slave: %w", err))
	}
	return m, s, nil
}

// Resize sets a terminal's window size.
func Resize(f *os.File, width, height uint16) error {
	conn, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = conn.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: width, Row: height})
	})
	if err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("resizing tty: %w", ioErr)
	}
	return nil
}
