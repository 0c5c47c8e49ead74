package channel

import (
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// VsockPort is the agent's vsock port.
const VsockPort = 1024

// VsockListener accepts AF_VSOCK stream connections.
type VsockListener struct {
	fd   int
	port uint32

	closeOnce sync.Once
}

// ListenVsock listens on the given vsock port for any CID.
func ListenVsock(port uint32) (*VsockListener, error) {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating vsock socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrVM{CID: unix.VMADDR_CID_ANY, Port: port}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding vsock port %d: %w", port, err)
	}
	if err := unix.Listen(fd, 4); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listening on vsock port %d: %w", port, err)
	}
	return &VsockListener{fd: fd, port: port}, nil
}

// Accept blocks in accept4 (on its own thread) until a host connects.
func (l *VsockListener) Accept() (net.Conn, error) {
	for {
		nfd, sa, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("accepting vsock connection: %w", err)
		}
		if !fromHost(sa) {
			unix.Close(nfd)
			continue
		}
		vm := sa.(*unix.SockaddrVM)
		remote := fmt.Sprintf("vsock:%d:%d", vm.CID, vm.Port)
		f := os.NewFile(uintptr(nfd), remote)
		return newFileConn(f, Addr{Net: "vsock", Name: remote}), nil
	}
}

// fromHost reports whether a peer is the host (CID 2): only the host may
// talk to the agent, not another VM or a local (CID 1) peer.
func fromHost(sa unix.Sockaddr) bool {
	vm, ok := sa.(*unix.SockaddrVM)
	return ok && vm.CID == unix.VMADDR_CID_HOST
}

// Close shuts the socket down, which wakes a blocked accept.
func (l *VsockListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		unix.Shutdown(l.fd, unix.SHUT_RDWR)
		err = unix.Close(l.fd)
	})
	return err
}

func (l *VsockListener) Addr() net.Addr {
	return Addr{Net: "vsock", Name: fmt.Sprintf("vsock::%d", l.port)}
}

var _ net.Listener = (*VsockListener)(nil)
