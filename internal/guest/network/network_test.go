package network

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/errdefs"
)

// fakeNL is a guest with NICs, logging every change as an `ip` command.
type fakeNL struct {
	links []netlink.Link
	log   []string
	// macErr, if set, fails LinkSetHardwareAddr.
	macErr error
}

func (f *fakeNL) LinkList() ([]netlink.Link, error) { return f.links, nil }
func (f *fakeNL) LinkByName(name string) (netlink.Link, error) {
	for _, l := range f.links {
		if l.Attrs().Name == name {
			return l, nil
		}
	}
	return nil, netlink.LinkNotFoundError{}
}
func (f *fakeNL) LinkSetDown(l netlink.Link) error {
	f.log = append(f.log, "link set "+l.Attrs().Name+" down")
	return nil
}
func (f *fakeNL) LinkSetName(l netlink.Link, n string) error {
	f.log = append(f.log, "link set "+l.Attrs().Name+" name "+n)
	l.Attrs().Name = n
	return nil
}
func (f *fakeNL) LinkSetMTU(l netlink.Link, m int) error {
	f.log = append(f.log, fmt.Sprintf("link set %s mtu %d", l.Attrs().Name, m))
	return nil
}
func (f *fakeNL) LinkSetHardwareAddr(l netlink.Link, mac net.HardwareAddr) error {
	if f.macErr != nil {
		return f.macErr
	}
	f.log = append(f.log, "link set "+l.Attrs().Name+" address "+mac.String())
	l.Attrs().HardwareAddr = mac
	return nil
}
func (f *fakeNL) LinkSetUp(l netlink.Link) error {
	f.log = append(f.log, "link set "+l.Attrs().Name+" up")
	return nil
}
func (f *fakeNL) AddrReplace(l netlink.Link, a *netlink.Addr) error {
	f.log = append(f.log, fmt.Sprintf("addr replace %s dev %s flags %d", a.IPNet, l.Attrs().Name, a.Flags))
	return nil
}
func (f *fakeNL) RouteReplace(r *netlink.Route) error {
	f.log = append(f.log, fmt.Sprintf("route replace %v via %v dev %d scope %d metric %d", r.Dst, r.Gw, r.LinkIndex, r.Scope, r.Priority))
	return nil
}
func (f *fakeNL) NeighSet(n *netlink.Neigh) error {
	f.log = append(f.log, fmt.Sprintf("neigh replace %s lladdr %s dev %d", n.IP, n.HardwareAddr, n.LinkIndex))
	return nil
}

func nic(name string, index int, mac string) netlink.Link {
	m, _ := net.ParseMAC(mac)
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: name, Index: index, HardwareAddr: m, MTU: 1500}}
}

func TestApply(t *testing.T) {
	// The guest calls its NICs eth0 and eth1 in PCI order; the pod's
	// second interface is the guest's eth0.
	f := &fakeNL{links: []netlink.Link{
		&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", Index: 1, MTU: 65536}},
		nic("eth0", 2, "02:00:00:00:00:02"),
		nic("eth1", 3, "02:00:00:00:00:01"),
	}}
	req := &agentapi.SetupNetworkRequest{
		Interfaces: []*agentapi.NetInterface{
			{Name: "eth0", Mac: "02:00:00:00:00:01", Mtu: 1400, Addresses: []string{"10.88.0.5/16", "fd00::5/64"}},
			{Name: "net1", Mac: "02:00:00:00:00:02", Mtu: 1500, Addresses: []string{"192.168.7.5/24"}},
		},
		Routes: []*agentapi.NetRoute{
			{Gateway: "10.88.0.1", Device: "eth0", Family: 4},
			{Dest: "10.88.0.1/32", Device: "eth0", Scope: 253, Family: 4},
		},
		Neighbors: []*agentapi.NetNeighbor{{Ip: "10.88.0.1", Mac: "ee:ee:ee:ee:ee:ee", Device: "eth0"}},
	}
	if err := Apply(f, req); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"link set eth1 down", "link set eth1 name hullnic0",
		"link set eth0 down", "link set eth0 name hullnic1",
		"link set hullnic0 name eth0", "link set eth0 mtu 1400", "link set eth0 up",
		"addr replace 10.88.0.5/16 dev eth0 flags 0", "addr replace fd00::5/64 dev eth0 flags 2",
		"link set hullnic1 name net1", "link set net1 up",
		"addr replace 192.168.7.5/24 dev net1 flags 0",
		// the link route first, although it came second
		"route replace 10.88.0.1/32 via <nil> dev 3 scope 253 metric 0",
		"route replace <nil> via 10.88.0.1 dev 3 scope 0 metric 0",
		"neigh replace 10.88.0.1 lladdr ee:ee:ee:ee:ee:ee dev 3",
	}
	if !slices.Equal(f.log, want) {
		t.Errorf("applied\n got %q\nwant %q", f.log, want)
	}
}

func TestApplyErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  *agentapi.SetupNetworkRequest
		want []string
	}{
		{"unknown mac", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "02:00:00:00:00:09"}}},
			[]string{"eth0", "02:00:00:00:00:09"}},
		{"bad mac", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "nope"}}},
			[]string{`"nope"`}},
		{"bad name", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{{Name: "a/b", Mac: "02:00:00:00:00:01"}}},
			[]string{`"a/b"`}},
		{"bad address", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "02:00:00:00:00:01", Addresses: []string{"10.0.0.300/8"}}}},
			[]string{"10.0.0.300/8"}},
		{"route to unknown device", &agentapi.SetupNetworkRequest{Routes: []*agentapi.NetRoute{{Gateway: "10.0.0.1", Device: "eth7", Family: 4}}},
			[]string{`"eth7"`, "not one of the interfaces"}},
		{"bad guest mac", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "02:00:00:00:00:01", GuestMac: "02:00:00"}}},
			[]string{"eth0", `"02:00:00"`}},
		{"unknown guest mac", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "02:00:00:00:00:05", GuestMac: "02:00:00:00:00:09"}}},
			[]string{"eth0", "02:00:00:00:00:09"}},
		{"two interfaces, one nic", &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{
			{Name: "eth0", Mac: "02:00:00:00:00:05", GuestMac: "02:00:00:00:00:01"},
			{Name: "eth1", Mac: "02:00:00:00:00:01"}}},
			[]string{"eth1", "02:00:00:00:00:01", "same NIC as interface eth0"}},
		{"route family", &agentapi.SetupNetworkRequest{
			Interfaces: []*agentapi.NetInterface{{Name: "eth0", Mac: "02:00:00:00:00:01"}},
			Routes:     []*agentapi.NetRoute{{Gateway: "10.0.0.1", Device: "eth0"}}},
			[]string{"family 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeNL{links: []netlink.Link{nic("eth0", 2, "02:00:00:00:00:01")}}
			err := Apply(f, tc.req)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error %v, want invalid argument", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if len(f.log) != 0 {
				t.Errorf("changed the guest on a bad request: %q", f.log)
			}
		})
	}
}

// A NIC restored from a template is found by the MAC it has and given the
// pod's before anything else is configured; a guest MAC equal to the MAC
// is no change.
func TestApplyGuestMAC(t *testing.T) {
	f := &fakeNL{links: []netlink.Link{
		nic("eth0", 2, "02:aa:00:00:00:01"), // the template's MAC
		nic("eth1", 3, "02:00:00:00:00:02"),
	}}
	req := &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{
		{Name: "eth0", Mac: "02:00:00:00:00:01", GuestMac: "02:AA:00:00:00:01", Addresses: []string{"10.88.0.5/16"}},
		{Name: "eth1", Mac: "02:00:00:00:00:02", GuestMac: "02:00:00:00:00:02"},
	}}
	if err := Apply(f, req); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"link set eth0 address 02:00:00:00:00:01",
		"link set eth0 up", "addr replace 10.88.0.5/16 dev eth0 flags 0",
		"link set eth1 up",
	}
	if !slices.Equal(f.log, want) {
		t.Errorf("applied\n got %q\nwant %q", f.log, want)
	}
}

func TestApplyGuestMACFailure(t *testing.T) {
	f := &fakeNL{links: []netlink.Link{nic("eth0", 2, "02:aa:00:00:00:01")}, macErr: errors.New("device or resource busy")}
	err := Apply(f, &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{
		{Name: "net0", Mac: "02:00:00:00:00:01", GuestMac: "02:aa:00:00:00:01"},
	}})
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"net0", "02:aa:00:00:00:01", "02:00:00:00:00:01", "device or resource busy"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %s", err, w)
		}
	}
	if len(f.log) != 0 {
		t.Errorf("went on after the MAC failed: %q", f.log)
	}
}

// inNewNetns returns a netlink handle on a network namespace of the
// test's own, which ends with the test.
func inNewNetns(t *testing.T) *netlink.Handle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace: run the tests as root (sudo go test)")
	}
	type result struct {
		h   *netlink.Handle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// This thread enters the new namespace and is never unlocked, so
		// it ends with the goroutine; the handle's sockets stay in the
		// namespace and keep it alive.
		runtime.LockOSThread()
		ns, err := netns.New() // unshare(CLONE_NEWNET)
		if err != nil {
			ch <- result{nil, fmt.Errorf("making a network namespace: %w", err)}
			return
		}
		defer ns.Close()
		h, err := netlink.NewHandle()
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(r.h.Close)
	return r.h
}

// The MAC change on a real kernel: a veth (virtio-net is not available
// here) that is up, as a restored guest's NIC is.
func TestApplyGuestMACInNetns(t *testing.T) {
	h := inNewNetns(t)
	template, _ := net.ParseMAC("02:aa:00:00:00:01")
	// ip link add eth0 address 02:aa:00:00:00:01 type veth peer name peer0
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: template}, PeerName: "peer0"}
	if err := h.LinkAdd(veth); err != nil {
		t.Skipf("cannot make a veth pair in the test's namespace: %v", err)
	}
	// ip link set eth0 up
	if err := h.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	req := &agentapi.SetupNetworkRequest{Interfaces: []*agentapi.NetInterface{
		{Name: "net0", Mac: "02:00:00:00:00:01", GuestMac: "02:aa:00:00:00:01", Addresses: []string{"10.88.0.5/16"}},
	}}
	if err := Apply(h, req); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("net0")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Attrs().HardwareAddr.String(); got != "02:00:00:00:00:01" {
		t.Errorf("net0 has MAC %s, want 02:00:00:00:00:01", got)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != "10.88.0.5/16" {
		t.Errorf("net0 addresses %v, %v", addrs, err)
	}
	// Applying again finds the NIC by the MAC it now has: no change.
	if err := Apply(h, req); err == nil || !strings.Contains(err.Error(), "02:aa:00:00:00:01") {
		t.Errorf("second apply with the old guest MAC: %v", err)
	}
}
