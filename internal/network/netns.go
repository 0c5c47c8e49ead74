package network

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNetnsGone is wrapped by openNetns's error when the namespace path
// does not exist (any more).
var ErrNetnsGone = errors.New("network namespace does not exist")

// nsHandle is an open network namespace and a netlink handle whose
// sockets live in it: netlink calls through it need no setns.
type nsHandle struct {
	path string
	ns   netns.NsHandle
	nl   *netlink.Handle
	id   string // see netnsID
}

// openNetns opens the network namespace at path (a bind-mounted nsfs
// file such as /var/run/netns/cni-..., or /proc/<pid>/ns/net).
func openNetns(path string) (*nsHandle, error) {
	if path == "" {
		return nil, errors.New("network namespace path is empty")
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("opening network namespace %s: %w", path, ErrNetnsGone)
		}
		return nil, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	// A regular file or another namespace type would be entered by
	// NewHandleAt with a confusing EINVAL: say what it is.
	if t, err := unix.IoctlRetInt(int(ns), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		ns.Close()
		return nil, fmt.Errorf("opening network namespace %s: not a network namespace", path)
	}
	id, err := fdNetnsID(int(ns))
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("opening network namespace %s: %w", path, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("opening netlink in network namespace %s: %w", path, err)
	}
	return &nsHandle{path: path, ns: ns, nl: h, id: id}, nil
}

func (n *nsHandle) Close() {
	n.nl.Close()
	n.ns.Close()
}

// fdNetnsID identifies the namespace behind fd (nsfs device and inode),
// so that a releaser never acts in a different namespace that reused a
// recorded path.
func fdNetnsID(fd int) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", fmt.Errorf("stat: %w", err)
	}
	return strconv.FormatUint(st.Dev, 10) + ":" + strconv.FormatUint(st.Ino, 10), nil
}

// inNetns runs fn on an OS thread that has entered the namespace. The
// thread is never handed back to the Go scheduler (its goroutine exits
// locked, so the runtime discards it): fn may change the thread further
// (unshare a mount namespace) and nothing else can ever run there.
func (n *nsHandle) inNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// setns(<netns fd>, CLONE_NEWNET), as `ip netns exec` does
		if err := unix.Setns(int(n.ns), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("entering network namespace %s: %w", n.path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
