package shim

import (
	"errors"
	"io/fs"
	"net"
	"strings"
	"syscall"
	"time"
)

// serveTimeout bounds the dial that asks whether a shim serves a socket.
const serveTimeout = 5 * time.Second

// shimServes reports whether a shim listens on address. Only a definite
// answer counts as "no": nobody listening (ECONNREFUSED) or no socket
// file. A dial that merely takes long — ten VMs booting on two cores
// starve everyone, this process included — is a live shim: taking it
// for dead made `start` remove a serving shim's socket and start a
// second, VM-less shim for the pod's next container ("sandbox ... has no
// VM in this shim"), and `shim delete` remove a live shim's socket.
func shimServes(address string) bool {
	return shimServesWith(address, func(path string) error {
		c, err := net.DialTimeout("unix", path, serveTimeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func shimServesWith(address string, dial func(path string) error) bool {
	path := strings.TrimPrefix(address, "unix://")
	err := dial(path)
	switch {
	case err == nil:
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, fs.ErrNotExist): // ENOENT matches fs.ErrNotExist
		return false
	default:
		return true // no answer in time: alive, only slow
	}
}
