// Package network configures the guest's NICs from the agent's
// SetupNetworkRequest: the pod's interfaces, addresses, routes and
// neighbours as the host found them in the pod's network namespace.
//
// It runs in the guest and uses only netlink on the guest kernel; it
// imports nothing from the host tree.
package network

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

// Netlink is the part of netlink.Handle that Apply uses, so that tests can
// run it against a network namespace of their own.
type Netlink interface {
	LinkList() ([]netlink.Link, error)
	LinkByName(name string) (netlink.Link, error)
	LinkSetDown(link netlink.Link) error
	LinkSetName(link netlink.Link, name string) error
	LinkSetMTU(link netlink.Link, mtu int) error
	LinkSetHardwareAddr(link netlink.Link, hwaddr net.HardwareAddr) error
	LinkSetUp(link netlink.Link) error
	AddrReplace(link netlink.Link, addr *netlink.Addr) error
	RouteReplace(route *netlink.Route) error
	NeighSet(neigh *netlink.Neigh) error
}

var _ Netlink = (*netlink.Handle)(nil)

// Apply configures the guest network as req describes, through h (nil:
// the agent's own network namespace). Errors for a request that cannot
// match the guest (a MAC no NIC has, a malformed address) wrap
// errdefs.ErrInvalidArgument.
func Apply(h Netlink, req *agentapi.SetupNetworkRequest) error {
	if h == nil {
		h = &netlink.Handle{}
	}
	plan, err := parse(req)
	if err != nil {
		return fmt.Errorf("setting up the network: %w: %w", errdefs.ErrInvalidArgument, err)
	}
	links, err := h.LinkList()
	if err != nil {
		// ip link show
		return fmt.Errorf("setting up the network: listing links: %w", err)
	}
	byMAC := map[string]netlink.Link{}
	for _, l := range links {
		if mac := l.Attrs().HardwareAddr; len(mac) > 0 {
			byMAC[mac.String()] = l
		}
	}

	// Rename in two passes, so that NICs swapping names (the guest calls
	// the second NIC eth0, the pod calls it eth1) never collide.
	nics := make([]netlink.Link, len(plan.ifaces))
	for i, ifc := range plan.ifaces {
		l, ok := byMAC[ifc.guestMAC().String()]
		if !ok {
			return fmt.Errorf("setting up interface %s: %w: no guest NIC has MAC %s", ifc.name, errdefs.ErrInvalidArgument, ifc.guestMAC())
		}
		nics[i] = l
	}
	for i, ifc := range plan.ifaces {
		if err := setMAC(h, nics[i], ifc); err != nil {
			return err
		}
	}
	for i, ifc := range plan.ifaces {
		l := nics[i]
		if l.Attrs().Name == ifc.name {
			continue
		}
		// ip link set dev <nic> down
		if err := h.LinkSetDown(l); err != nil {
			return fmt.Errorf("setting up interface %s: bringing %s down: %w", ifc.name, l.Attrs().Name, err)
		}
		tmp := fmt.Sprintf("hullnic%d", i)
		// ip link set dev <nic> name hullnic<i>
		if err := h.LinkSetName(l, tmp); err != nil {
			return fmt.Errorf("setting up interface %s: renaming %s: %w", ifc.name, l.Attrs().Name, err)
		}
		l.Attrs().Name = tmp
	}
	for i, ifc := range plan.ifaces {
		l := nics[i]
		if l.Attrs().Name != ifc.name {
			// ip link set dev hullnic<i> name <name>
			if err := h.LinkSetName(l, ifc.name); err != nil {
				return fmt.Errorf("setting up interface %s: renaming %s: %w", ifc.name, l.Attrs().Name, err)
			}
			l.Attrs().Name = ifc.name
		}
		if ifc.mtu > 0 && l.Attrs().MTU != ifc.mtu {
			// ip link set dev <name> mtu <mtu>
			if err := h.LinkSetMTU(l, ifc.mtu); err != nil {
				return fmt.Errorf("setting up interface %s: mtu %d: %w", ifc.name, ifc.mtu, err)
			}
		}
		// ip link set dev <name> up
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("setting up interface %s: bringing it up: %w", ifc.name, err)
		}
		for _, a := range ifc.addrs {
			addr := &netlink.Addr{IPNet: a}
			if a.IP.To4() == nil {
				// The host's namespace holds the same address: duplicate
				// address detection would only delay it.
				addr.Flags = unix.IFA_F_NODAD
			}
			// ip addr replace <cidr> dev <name> [nodad]
			if err := h.AddrReplace(l, addr); err != nil {
				return fmt.Errorf("setting up interface %s: address %s: %w", ifc.name, a, err)
			}
		}
	}

	index := func(name string) (int, error) {
		l, err := h.LinkByName(name)
		if err != nil {
			return 0, fmt.Errorf("%w: device %s: %w", errdefs.ErrInvalidArgument, name, err)
		}
		return l.Attrs().Index, nil
	}
	// Link routes first: a gateway must be reachable when its route is added.
	for _, pass := range []bool{false, true} {
		for _, r := range plan.routes {
			if (r.Gw != nil) != pass {
				continue
			}
			nr := *r
			if nr.LinkIndex, err = index(plan.routeDev[r]); err != nil {
				return fmt.Errorf("adding route %s: %w", describeRoute(r, plan.routeDev[r]), err)
			}
			// ip route replace <dest> [via <gw>] dev <dev> [src <src>] [scope <scope>] [metric <metric>]
			if err := h.RouteReplace(&nr); err != nil {
				return fmt.Errorf("adding route %s: %w", describeRoute(r, plan.routeDev[r]), err)
			}
		}
	}
	for _, n := range plan.neighs {
		nn := *n
		if nn.LinkIndex, err = index(plan.neighDev[n]); err != nil {
			return fmt.Errorf("adding neighbour %s: %w", n.IP, err)
		}
		// ip neigh replace <ip> lladdr <mac> dev <dev> nud permanent
		if err := h.NeighSet(&nn); err != nil {
			return fmt.Errorf("adding neighbour %s: %w", n.IP, err)
		}
	}
	return nil
}

// setMAC gives a NIC restored from a template (ifc.oldMAC set) the pod's
// MAC, before anything else is configured on it. virtio-net takes a new
// address while up.
func setMAC(h Netlink, l netlink.Link, ifc iface) error {
	if ifc.oldMAC == nil {
		return nil
	}
	// ip link set dev <nic> address <mac>
	if err := h.LinkSetHardwareAddr(l, ifc.mac); err != nil {
		return fmt.Errorf("setting up interface %s: changing the MAC of %s from %s to %s: %w", ifc.name, l.Attrs().Name, ifc.oldMAC, ifc.mac, err)
	}
	l.Attrs().HardwareAddr = ifc.mac
	return nil
}

func describeRoute(r *netlink.Route, dev string) string {
	dst := "default"
	if r.Dst != nil {
		dst = r.Dst.String()
	}
	var b strings.Builder
	b.WriteString(dst)
	if r.Gw != nil {
		b.WriteString(" via " + r.Gw.String())
	}
	b.WriteString(" dev " + dev)
	return b.String()
}

type iface struct {
	name string
	mac  net.HardwareAddr
	// oldMAC is the MAC the guest NIC has now, when it is not mac (a VM
	// restored from a template); nil: the NIC has mac.
	oldMAC net.HardwareAddr
	mtu    int
	addrs  []*net.IPNet
}

// guestMAC is the MAC that finds the interface's NIC in the guest.
func (i iface) guestMAC() net.HardwareAddr {
	if i.oldMAC != nil {
		return i.oldMAC
	}
	return i.mac
}

// plan is a validated request.
type plan struct {
	ifaces   []iface
	routes   []*netlink.Route
	routeDev map[*netlink.Route]string
	neighs   []*netlink.Neigh
	neighDev map[*netlink.Neigh]string
}

// parse validates req; every error names the offending value.
func parse(req *agentapi.SetupNetworkRequest) (*plan, error) {
	p := &plan{routeDev: map[*netlink.Route]string{}, neighDev: map[*netlink.Neigh]string{}}
	var errs []error
	names := map[string]bool{}
	macs := map[string]bool{}
	claimed := map[string]string{} // guest MAC -> the interface whose NIC it finds
	for _, in := range req.GetInterfaces() {
		ifc := iface{name: in.GetName(), mtu: int(in.GetMtu())}
		if ifc.name == "" || len(ifc.name) >= unix.IFNAMSIZ || strings.ContainsAny(ifc.name, "/ \t\n:") {
			errs = append(errs, fmt.Errorf("interface name %q is invalid", ifc.name))
		} else if names[ifc.name] {
			errs = append(errs, fmt.Errorf("interface name %q given twice", ifc.name))
		}
		names[ifc.name] = true
		mac, err := net.ParseMAC(in.GetMac())
		dup := false
		if err != nil || len(mac) != 6 {
			errs = append(errs, fmt.Errorf("interface %s: MAC %q is invalid", ifc.name, in.GetMac()))
		} else if dup = macs[mac.String()]; dup {
			errs = append(errs, fmt.Errorf("interface %s: MAC %s given twice", ifc.name, mac))
		}
		ifc.mac = mac
		macs[mac.String()] = true
		if g := in.GetGuestMac(); g != "" {
			old, err := net.ParseMAC(g)
			if err != nil || len(old) != 6 {
				errs = append(errs, fmt.Errorf("interface %s: guest MAC %q is invalid", ifc.name, g))
			} else if old.String() != mac.String() {
				ifc.oldMAC = old
			}
		}
		// Two interfaces must not find the same NIC (said once: a MAC given
		// twice is that already).
		if g := ifc.guestMAC(); len(g) == 6 {
			if other, ok := claimed[g.String()]; ok && !(dup && ifc.oldMAC == nil) {
				errs = append(errs, fmt.Errorf("interface %s: MAC %s finds the same NIC as interface %s", ifc.name, g, other))
			}
			claimed[g.String()] = ifc.name
		}
		if ifc.mtu < 0 || ifc.mtu > 65535 || ifc.mtu > 0 && ifc.mtu < 68 {
			errs = append(errs, fmt.Errorf("interface %s: MTU %d is invalid", ifc.name, in.GetMtu()))
		}
		for _, a := range in.GetAddresses() {
			ip, n, err := net.ParseCIDR(a)
			if err != nil {
				errs = append(errs, fmt.Errorf("interface %s: address %q: %w", ifc.name, a, err))
				continue
			}
			n.IP = ip
			ifc.addrs = append(ifc.addrs, n)
		}
		p.ifaces = append(p.ifaces, ifc)
	}
	for _, r := range req.GetRoutes() {
		nr := &netlink.Route{
			Scope:    netlink.Scope(r.GetScope()),
			Priority: int(r.GetMetric()),
			Table:    unix.RT_TABLE_MAIN,
		}
		what := fmt.Sprintf("route %q via %q dev %q", r.GetDest(), r.GetGateway(), r.GetDevice())
		switch r.GetFamily() {
		case 4:
			nr.Family = netlink.FAMILY_V4
		case 6:
			nr.Family = netlink.FAMILY_V6
		default:
			errs = append(errs, fmt.Errorf("%s: family %d is not 4 or 6", what, r.GetFamily()))
		}
		if !names[r.GetDevice()] {
			errs = append(errs, fmt.Errorf("%s: device is not one of the interfaces", what))
		}
		if d := r.GetDest(); d != "" {
			_, n, err := net.ParseCIDR(d)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
			}
			nr.Dst = n
		}
		for _, f := range []struct {
			s  string
			ip *net.IP
		}{{r.GetGateway(), &nr.Gw}, {r.GetSource(), &nr.Src}} {
			if f.s == "" {
				continue
			}
			if *f.ip = net.ParseIP(f.s); *f.ip == nil {
				errs = append(errs, fmt.Errorf("%s: address %q is invalid", what, f.s))
			}
		}
		p.routes = append(p.routes, nr)
		p.routeDev[nr] = r.GetDevice()
	}
	for _, n := range req.GetNeighbors() {
		what := fmt.Sprintf("neighbour %q lladdr %q dev %q", n.GetIp(), n.GetMac(), n.GetDevice())
		ip := net.ParseIP(n.GetIp())
		mac, err := net.ParseMAC(n.GetMac())
		if ip == nil || err != nil {
			errs = append(errs, fmt.Errorf("%s: invalid address", what))
		}
		if !names[n.GetDevice()] {
			errs = append(errs, fmt.Errorf("%s: device is not one of the interfaces", what))
		}
		fam := netlink.FAMILY_V4
		if ip != nil && ip.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		nn := &netlink.Neigh{Family: fam, IP: ip, HardwareAddr: mac, State: netlink.NUD_PERMANENT}
		p.neighs = append(p.neighs, nn)
		p.neighDev[nn] = n.GetDevice()
	}
	return p, errors.Join(errs...)
}
