package network

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

func macvtapName(i int) string { return "mvtap" + strconv.Itoa(i) + "_hull" }

// setupMacvtap creates a passthru macvtap on ifc and returns its open
// queue and its MAC (ifc's, inherited).
func setupMacvtap(h *nsHandle, ifc Interface, i int, record func(state.Resource) error) (*os.File, net.HardwareAddr, error) {
	name := macvtapName(i)
	if err := record(state.Resource{Kind: state.KindMacvtap, Key: keyOf(h.path, name), Link: name}); err != nil {
		return nil, nil, err
	}
	// ip link add link eth0 name mvtap0_hull type macvtap mode passthru
	// (no address: passthru inherits eth0's, and setting one would change
	// eth0's)
	if err := h.nl.LinkAdd(&netlink.Macvtap{Macvlan: netlink.Macvlan{
		LinkAttrs: netlink.LinkAttrs{Name: name, ParentIndex: ifc.Index, TxQLen: -1},
		Mode:      netlink.MACVLAN_MODE_PASSTHRU,
	}}); err != nil {
		return nil, nil, fmt.Errorf("creating macvtap %s: %w", name, err)
	}
	l, err := h.nl.LinkByName(name)
	if err != nil {
		return nil, nil, fmt.Errorf("creating macvtap %s: %w", name, err)
	}
	mac := l.Attrs().HardwareAddr
	if !bytes.Equal(mac, ifc.MAC) {
		return nil, nil, fmt.Errorf("macvtap %s has MAC %s, not %s's %s", name, mac, ifc.Name, ifc.MAC)
	}
	if l.Attrs().MTU != ifc.MTU {
		// ip link set dev mvtap0_hull mtu <eth0's mtu>
		if err := h.nl.LinkSetMTU(l, ifc.MTU); err != nil {
			return nil, nil, fmt.Errorf("setting the MTU of %s: %w", name, err)
		}
	}
	// ip link set dev mvtap0_hull up
	if err := h.nl.LinkSetUp(l); err != nil {
		return nil, nil, fmt.Errorf("bringing %s up: %w", name, err)
	}
	var f *os.File
	err = h.inNetns(func() (err error) {
		f, err = openMacvtap(name, l.Attrs().Index)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return f, mac, nil
}

// openMacvtap opens the character device of the macvtap name (ifindex
// index in the calling thread's network namespace). The host's /dev/tapN
// is named after the ifindex, which is only unique per namespace, and
// its /sys/class/net shows the host's namespace. So, on this thread only
// (which must never run anything else afterwards: see inNetns), it
// mounts a sysfs of the pod's namespace in a private mount namespace,
// reads the device number there and opens a node of its own on a tmpfs.
// Nothing is left on any filesystem.
func openMacvtap(name string, index int) (*os.File, error) {
	fail := func(step string, err error) (*os.File, error) {
		return nil, fmt.Errorf("opening the device of macvtap %s: %s: %w", name, step, err)
	}
	// unshare --mount (this thread only); mount --make-rprivate /
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fail("unshare", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail("making / private", err)
	}
	// mount -t sysfs sysfs /sys (shows the namespace of the mounter)
	if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fail("mounting sysfs", err)
	}
	devFile := "/sys/class/net/" + name + "/macvtap/tap" + strconv.Itoa(index) + "/dev"
	b, err := os.ReadFile(devFile)
	if err != nil {
		return fail("reading the device number", err)
	}
	majS, minS, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	maj, err1 := strconv.ParseUint(majS, 10, 32)
	min, err2 := strconv.ParseUint(minS, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return fail("parsing "+devFile, fmt.Errorf("%q", b))
	}
	// mount -t tmpfs tmpfs /sys; mknod /sys/tapN c <major> <minor>
	if err := unix.Mount("tmpfs", "/sys", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "size=16k,mode=700"); err != nil {
		return fail("mounting a tmpfs", err)
	}
	node := "/sys/tap" + strconv.Itoa(index)
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(unix.Mkdev(uint32(maj), uint32(min)))); err != nil {
		return fail("mknod", err)
	}
	f, err := os.OpenFile(node, os.O_RDWR, 0)
	if err != nil {
		return fail("open", err)
	}
	// The mount namespace, and the node with it, goes when the thread exits.
	return f, nil
}
