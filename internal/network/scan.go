package network

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Interface is a link CNI made in the pod's network namespace.
type Interface struct {
	Name  string
	Index int
	// Type is the rtnetlink kind ("veth", "macvlan", "vlan", "device").
	Type string
	MAC  net.HardwareAddr
	MTU  int
	// Addrs are the IPv4 and IPv6 addresses, IP with its prefix. IPv6
	// link-local addresses are left out: the guest derives the same one
	// from the same MAC.
	Addrs []*net.IPNet
}

// Route is a unicast route of the main table through an Interface.
// Routes the kernel made itself (proto kernel: the prefix route of each
// address, fe80::/64) are left out; the guest kernel makes them too.
type Route struct {
	Dst    *net.IPNet // nil: default route
	Gw     net.IP
	Src    net.IP
	Dev    string
	Scope  netlink.Scope
	Metric int
	Family int // 4 or 6
}

// Neighbor is a permanent neighbour entry on an Interface.
type Neighbor struct {
	IP  net.IP
	MAC net.HardwareAddr
	Dev string
}

// Netns is what Scan found in a pod's network namespace.
type Netns struct {
	Path       string
	Interfaces []Interface
	Routes     []Route
	Neighbors  []Neighbor
}

// bridgeable lists the link kinds whose traffic Hull can carry into the
// VM: Ethernet devices that send and receive frames addressed to their
// own MAC, so that a tc redirect or a passthru macvtap on them hands the
// guest exactly the pod's traffic. A bridge or a dummy device carries no
// pod traffic of its own; ipvlan, tunnels and WireGuard are not Ethernet
// or share a MAC with other pods.
var bridgeable = []string{"veth", "macvlan", "vlan", "device"}

// UnsupportedLinkError names a link Hull cannot bridge into the VM.
type UnsupportedLinkError struct {
	Netns, Name, Type string
}

func (e *UnsupportedLinkError) Error() string {
	return fmt.Sprintf("interface %s (type %s) in network namespace %s cannot be bridged into the VM: hull supports %v Ethernet links",
		e.Name, e.Type, e.Netns, bridgeable)
}

// Scan reads the links (other than loopback, and links of other kinds
// that are down without an address: see idleLink), addresses, routes and
// permanent neighbours of the network namespace at path. It changes
// nothing. A path that does not exist wraps ErrNetnsGone; a link Hull
// cannot bridge is an *UnsupportedLinkError.
func Scan(path string) (*Netns, error) {
	h, err := openNetns(path)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return scan(h)
}

// idleLink says whether l is down and has no address: it carries none of
// the pod's traffic, and Scan leaves it out whatever its kind. The
// kernel's fallback tunnels are such links: with the ipip, sit or gre
// module loaded (Calico's IPIP nodes load ipip), every new network
// namespace has tunl0, sit0, gre0... down and without addresses, next to
// what CNI made.
func idleLink(h *nsHandle, l netlink.Link) (bool, error) {
	if l.Attrs().Flags&net.FlagUp != 0 {
		return false, nil
	}
	// ip addr show dev <name>
	addrs, err := h.nl.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return false, fmt.Errorf("scanning network namespace %s: addresses of %s: %w", h.path, l.Attrs().Name, err)
	}
	return len(addrs) == 0, nil
}

func scan(h *nsHandle) (*Netns, error) {
	out := &Netns{Path: h.path}
	// ip -d link show
	links, err := h.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("scanning network namespace %s: listing links: %w", h.path, err)
	}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 {
			continue
		}
		if !slices.Contains(bridgeable, l.Type()) || a.EncapType != "ether" || len(a.HardwareAddr) != 6 {
			idle, err := idleLink(h, l)
			if err != nil {
				return nil, err
			}
			if idle {
				continue
			}
			typ := l.Type()
			if l.Type() == "device" {
				typ = "device/" + a.EncapType
			}
			return nil, &UnsupportedLinkError{Netns: h.path, Name: a.Name, Type: typ}
		}
		ifc := Interface{Name: a.Name, Index: a.Index, Type: l.Type(), MAC: a.HardwareAddr, MTU: a.MTU}
		// ip addr show dev <name>
		addrs, err := h.nl.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("scanning network namespace %s: addresses of %s: %w", h.path, a.Name, err)
		}
		for _, ad := range addrs {
			if ad.IP.To4() == nil && ad.IP.IsLinkLocalUnicast() {
				continue
			}
			ifc.Addrs = append(ifc.Addrs, &net.IPNet{IP: ad.IP, Mask: ad.Mask})
		}
		// ip neigh show dev <name> nud permanent
		neighs, err := h.nl.NeighList(a.Index, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("scanning network namespace %s: neighbours of %s: %w", h.path, a.Name, err)
		}
		for _, n := range neighs {
			if n.State&netlink.NUD_PERMANENT != 0 && len(n.HardwareAddr) > 0 && n.IP != nil {
				out.Neighbors = append(out.Neighbors, Neighbor{IP: n.IP, MAC: n.HardwareAddr, Dev: a.Name})
			}
		}
		names[a.Index] = a.Name
		out.Interfaces = append(out.Interfaces, ifc)
	}

	// ip route show table main; ip -6 route show table main
	routes, err := h.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("scanning network namespace %s: listing routes: %w", h.path, err)
	}
	var errs []error
	for _, r := range routes {
		if r.Protocol == unix.RTPROT_KERNEL || r.Type != unix.RTN_UNICAST {
			continue
		}
		if len(r.MultiPath) > 0 {
			errs = append(errs, fmt.Errorf("route %s in network namespace %s is multipath, which hull does not support", r, h.path))
			continue
		}
		dev, ok := names[r.LinkIndex]
		if !ok {
			continue // through loopback
		}
		fam := 4
		if r.Family == netlink.FAMILY_V6 {
			fam = 6
		}
		dst := r.Dst
		if dst != nil {
			if ones, _ := dst.Mask.Size(); ones == 0 && dst.IP.IsUnspecified() {
				dst = nil // 0.0.0.0/0 is the default route
			}
		}
		out.Routes = append(out.Routes, Route{Dst: dst, Gw: r.Gw, Src: r.Src, Dev: dev, Scope: r.Scope, Metric: r.Priority, Family: fam})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}
