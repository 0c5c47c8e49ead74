package network

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/vm"
)

func cidr(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

// fixture is what Scan returns for a pod of the bridge plugin with a
// second interface (Multus-style) and a permanent neighbour.
func fixture() *Netns {
	return &Netns{
		Path: "/var/run/netns/cni-1",
		Interfaces: []Interface{
			{Name: "eth0", Index: 2, Type: "veth", MAC: mac("0a:58:0a:58:00:05"), MTU: 1450,
				Addrs: []*net.IPNet{cidr("10.88.0.5/16"), cidr("fd00::5/64")}},
			{Name: "net1", Index: 3, Type: "macvlan", MAC: mac("0a:58:0a:59:00:05"), MTU: 1500,
				Addrs: []*net.IPNet{cidr("192.168.7.5/24")}},
		},
		Routes: []Route{
			{Dst: nil, Gw: net.ParseIP("10.88.0.1"), Dev: "eth0", Family: 4},
			{Dst: cidr("10.96.0.0/12"), Gw: net.ParseIP("10.88.0.1"), Dev: "eth0", Metric: 5, Family: 4},
			{Dst: cidr("169.254.1.1/32"), Dev: "eth0", Scope: 253, Family: 4},
			{Dst: nil, Gw: net.ParseIP("fd00::1"), Dev: "eth0", Metric: 1024, Family: 6},
			{Dst: cidr("192.168.0.0/16"), Gw: net.ParseIP("192.168.7.1"), Src: net.ParseIP("192.168.7.5"), Dev: "net1", Family: 4},
		},
		Neighbors: []Neighbor{{IP: net.ParseIP("169.254.1.1"), MAC: mac("ee:ee:ee:ee:ee:ee"), Dev: "eth0"}},
	}
}

func TestBuildRequest(t *testing.T) {
	nics := []vm.NIC{{ID: "net0", MAC: mac("0a:58:0a:58:00:05")}, {ID: "net1", MAC: mac("0a:58:0a:59:00:05")}}
	got := prototext.Format(BuildRequest(fixture(), nics))
	want := prototext.Format(mustText(t, `
interfaces: {name: "eth0" mac: "0a:58:0a:58:00:05" mtu: 1450 addresses: "10.88.0.5/16" addresses: "fd00::5/64"}
interfaces: {name: "net1" mac: "0a:58:0a:59:00:05" mtu: 1500 addresses: "192.168.7.5/24"}
routes: {gateway: "10.88.0.1" device: "eth0" family: 4}
routes: {dest: "10.96.0.0/12" gateway: "10.88.0.1" device: "eth0" metric: 5 family: 4}
routes: {dest: "169.254.1.1/32" device: "eth0" scope: 253 family: 4}
routes: {gateway: "fd00::1" device: "eth0" metric: 1024 family: 6}
routes: {dest: "192.168.0.0/16" gateway: "192.168.7.1" device: "net1" source: "192.168.7.5" family: 4}
neighbors: {ip: "169.254.1.1" mac: "ee:ee:ee:ee:ee:ee" device: "eth0"}
`))
	if got != want {
		t.Errorf("request\n got %s\nwant %s", got, want)
	}

	// An interface without a NIC (none model) takes its routes and
	// neighbours with it.
	got = prototext.Format(BuildRequest(fixture(), nics[:0]))
	if got != "" {
		t.Errorf("request without NICs: %s", got)
	}
	if r := BuildRequest(nil, nil); len(r.Interfaces)+len(r.Routes)+len(r.Neighbors) != 0 {
		t.Errorf("nil scan: %v", r)
	}
}

func TestCheckModel(t *testing.T) {
	for in, want := range map[string]string{"": ModelTCFilter, "tcfilter": ModelTCFilter, "macvtap": ModelMacvtap, "none": ModelNone} {
		if got, err := CheckModel(in); err != nil || got != want {
			t.Errorf("CheckModel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"bridged", "TCFilter", "macvtap "} {
		_, err := CheckModel(bad)
		if !errors.Is(err, ErrInvalidModel) || !strings.Contains(err.Error(), `"`+bad+`"`) {
			t.Errorf("CheckModel(%q) = %v", bad, err)
		}
	}
	// The config package accepts exactly these models.
	if strings.Join(config.InternetworkingModels, ",") != strings.Join(Models, ",") {
		t.Errorf("config models %v, network models %v", config.InternetworkingModels, Models)
	}
}

func TestSetupWithoutNetwork(t *testing.T) {
	// none, or no namespace: no NIC, nothing recorded, the namespace is
	// not even opened (a bad path is not an error then).
	for _, o := range []Options{{Model: ModelNone, Netns: "/nonexistent"}, {Model: ModelTCFilter}} {
		ep, err := Setup(o)
		if err != nil || len(ep.NICs) != 0 || len(ep.Request.Interfaces) != 0 {
			t.Errorf("Setup(%+v) = %+v, %v", o, ep, err)
		}
	}
	if _, err := Setup(Options{Model: "bridged", Netns: "/x"}); !errors.Is(err, ErrInvalidModel) {
		t.Errorf("bad model: %v", err)
	}
	if os.Geteuid() != 0 {
		// Without root a namespace cannot be entered; the error still names it.
		if _, err := Setup(Options{Netns: "/nonexistent/ns", Recorder: nopRecorder{}}); err == nil || !strings.Contains(err.Error(), "/nonexistent/ns") {
			t.Errorf("missing netns: %v", err)
		}
	}
}

func mustText(t *testing.T, s string) *SetupNetworkRequestAlias {
	t.Helper()
	var r SetupNetworkRequestAlias
	if err := prototext.Unmarshal([]byte(s), &r); err != nil {
		t.Fatal(err)
	}
	return &r
}
