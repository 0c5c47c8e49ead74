package network

import (
	"fmt"
	"os"
	"strconv"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

const (
	// filterPrio is the priority of Hull's tc filters, so that teardown
	// deletes exactly them on a qdisc someone else also uses.
	filterPrio = 0xc1a5
	// Data keys of a KindTCFilter record.
	dataQdisc = "qdisc" // qdiscCreated: Hull added the ingress qdisc
	dataPrio  = "prio"
	// dataNetnsID (every kind) identifies the namespace (fdNetnsID).
	dataNetnsID  = "netns_id"
	qdiscCreated = "created"
	qdiscExisted = "existed"
)

// ingressHandle is the ingress qdisc's handle, "ffff:", which is also
// the parent of its filters.
var ingressHandle = netlink.MakeHandle(0xffff, 0)

func tapName(i int) string { return "tap" + strconv.Itoa(i) + "_hull" }

// setupTCFilter creates the tap for ifc and the redirects both ways, and
// returns the tap's open queue for QEMU.
func setupTCFilter(h *nsHandle, ifc Interface, i int, record func(state.Resource) error) (*os.File, error) {
	name := tapName(i)
	if err := record(state.Resource{Kind: state.KindTap, Key: keyOf(h.path, name), Link: name}); err != nil {
		return nil, err
	}
	var f *os.File
	err := h.inNetns(func() (err error) {
		f, err = openTap(name)
		return err
	})
	if err != nil {
		return nil, err
	}
	tap, err := h.nl.LinkByName(name)
	if err == nil {
		// ip link set dev tap0_hull mtu <eth0's mtu>
		err = h.nl.LinkSetMTU(tap, ifc.MTU)
	}
	if err == nil {
		// ip link set dev tap0_hull up
		err = h.nl.LinkSetUp(tap)
	}
	if err != nil {
		return f, fmt.Errorf("setting up tap %s: %w", name, err)
	}
	link, err := h.nl.LinkByIndex(ifc.Index)
	if err != nil {
		return f, fmt.Errorf("finding %s: %w", ifc.Name, err)
	}
	// Frames the VM sends leave through eth0, frames for the pod reach
	// the VM: the tap's filter first, so that eth0's traffic never goes
	// to a tap nobody forwards back from.
	if err := redirect(h, tap, link, record); err != nil {
		return f, err
	}
	if err := redirect(h, link, tap, record); err != nil {
		return f, err
	}
	return f, nil
}

// openTap creates the tap device name in the calling thread's network
// namespace and returns its (only) queue. The tap is not persistent: it
// disappears when the last descriptor (ours, QEMU's) is closed.
func openTap(name string) (*os.File, error) {
	// The tun driver creates the device in the namespace of the thread
	// that opens /dev/net/tun.
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating tap %s: %w", name, err)
	}
	// ip tuntap add dev tap0_hull mode tap vnet_hdr (without persist)
	var req struct {
		name  [unix.IFNAMSIZ]byte
		flags uint16
		_     [22]byte
	}
	copy(req.name[:], name)
	req.flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); e != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("creating tap %s: TUNSETIFF: %w", name, e)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// redirect sends every frame arriving at from out of to:
//
//	tc qdisc add dev <from> ingress
//	tc filter add dev <from> parent ffff: prio 49573 protocol all u32 match u8 0 0 \
//	    action mirred egress redirect dev <to>
func redirect(h *nsHandle, from, to netlink.Link, record func(state.Resource) error) error {
	fa := from.Attrs()
	// tc qdisc show dev <from> ingress
	qdiscs, err := h.nl.QdiscList(from)
	if err != nil {
		return fmt.Errorf("listing qdiscs of %s: %w", fa.Name, err)
	}
	haveIngress := false
	for _, q := range qdiscs {
		if q.Attrs().Parent == netlink.HANDLE_INGRESS {
			haveIngress = true
		}
	}
	if haveIngress {
		// tc filter show dev <from> ingress
		filters, err := h.nl.FilterList(from, ingressHandle)
		if err != nil {
			return fmt.Errorf("listing ingress filters of %s: %w", fa.Name, err)
		}
		for _, f := range filters {
			if f.Attrs().Priority == filterPrio {
				return fmt.Errorf("%s already has an ingress filter at hull's priority %d", fa.Name, filterPrio)
			}
		}
	}
	how := qdiscExisted
	if !haveIngress {
		how = qdiscCreated
	}
	if err := record(state.Resource{
		Kind: state.KindTCFilter, Key: keyOf(h.path, fa.Name, "ingress"), Link: fa.Name,
		Data: map[string]string{dataQdisc: how, dataPrio: strconv.Itoa(filterPrio), "redirect": to.Attrs().Name},
	}); err != nil {
		return err
	}
	if !haveIngress {
		// tc qdisc add dev <from> ingress
		if err := h.nl.QdiscAdd(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: fa.Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS,
		}}); err != nil {
			return fmt.Errorf("adding an ingress qdisc to %s: %w", fa.Name, err)
		}
	}
	// tc filter add dev <from> parent ffff: prio 49573 protocol all u32 match u8 0 0 \
	//     action mirred egress redirect dev <to>
	// (a nil selector is u32's match-all: one key of mask 0, value 0)
	if err := h.nl.FilterAdd(&netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: fa.Index, Parent: ingressHandle, Priority: filterPrio, Protocol: unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to.Attrs().Index,
		}},
	}); err != nil {
		return fmt.Errorf("adding the redirect filter %s -> %s: %w", fa.Name, to.Attrs().Name, err)
	}
	return nil
}
