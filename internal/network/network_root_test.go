package network

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/hull-runtime/hull/internal/state"
)

func TestScan(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	ns, err := Scan(nsPath(p.ns))
	if err != nil {
		t.Fatal(err)
	}
	if len(ns.Interfaces) != 1 {
		t.Fatalf("interfaces %+v, want eth0 only", ns.Interfaces)
	}
	ifc := ns.Interfaces[0]
	var addrs []string
	for _, a := range ifc.Addrs {
		addrs = append(addrs, a.String())
	}
	slices.Sort(addrs)
	if ifc.Name != "eth0" || ifc.Type != "veth" || ifc.MAC.String() != podMAC || ifc.MTU != 1400 ||
		!slices.Equal(addrs, []string{podIP + "/24", podIP6 + "/64"}) {
		t.Errorf("eth0 = %+v, addrs %v", ifc, addrs)
	}
	var routes []string
	for _, r := range ns.Routes {
		routes = append(routes, describe(r))
	}
	slices.Sort(routes)
	want := []string{"4 10.200.0.0/16 via 10.99.0.254 dev eth0 metric 7", "4 default via 10.99.0.1 dev eth0 metric 0", "6 default via fd99::1 dev eth0 metric 1024"}
	if !slices.Equal(routes, want) {
		t.Errorf("routes\n got %q\nwant %q", routes, want)
	}
	if len(ns.Neighbors) != 1 || ns.Neighbors[0].IP.String() != neighIP || ns.Neighbors[0].MAC.String() != neighMAC {
		t.Errorf("neighbours %+v", ns.Neighbors)
	}
}

func describe(r Route) string {
	dst := "default"
	if r.Dst != nil {
		dst = r.Dst.String()
	}
	s := string(rune('0'+r.Family)) + " " + dst
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	return s + " dev " + r.Dev + " metric " + itoa(r.Metric)
}

func itoa(i int) string { return strconv.Itoa(i) }

// linkLine is the line of `ip -d -o link show` output about link name,
// "" if there is none.
func linkLine(links, name string) string {
	for _, line := range strings.Split(links, "\n") {
		if strings.Contains(line, ": "+name+"@") || strings.Contains(line, ": "+name+":") {
			return line
		}
	}
	return ""
}

func TestSetupAndReleaseLeaveTheNetnsAsItWas(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		model string
		// preIngress: eth0 already has an ingress qdisc (another plugin's).
		preIngress bool
		links      map[string]string // name -> kind expected during
		records    map[state.Kind]int
	}{
		{ModelTCFilter, false, map[string]string{"eth0": "veth", "tap0_hull": "tun"}, map[state.Kind]int{state.KindTap: 1, state.KindTCFilter: 2}},
		{ModelTCFilter, true, map[string]string{"eth0": "veth", "tap0_hull": "tun"}, map[state.Kind]int{state.KindTap: 1, state.KindTCFilter: 2}},
		{ModelMacvtap, false, map[string]string{"eth0": "veth", "mvtap0_hull": "macvtap"}, map[state.Kind]int{state.KindMacvtap: 1}},
	} {
		name := tc.model
		if tc.preIngress {
			name += "/existing-ingress"
		}
		t.Run(name, func(t *testing.T) {
			p := newPod(t)
			if tc.preIngress {
				run(t, "tc", "-n", p.ns, "qdisc", "add", "dev", "eth0", "ingress")
				run(t, "tc", "-n", p.ns, "filter", "add", "dev", "eth0", "parent", "ffff:", "prio", "5", "protocol", "ip", "u32", "match", "ip", "dst", "10.250.0.1/32", "flowid", "ffff:1")
			}
			before := snapshot(t, p.ns)
			h := newHandle(t)
			ep, err := Setup(Options{Netns: nsPath(p.ns), Model: tc.model, Recorder: h})
			if err != nil {
				t.Fatal(err)
			}
			defer ep.Close()
			st := h.State()
			if got := st.CountByKind(); !mapsEqual(got, tc.records) {
				t.Errorf("recorded %v, want %v", got, tc.records)
			}
			if len(ep.NICs) != 1 || ep.NICs[0].MAC.String() != podMAC || ep.NICs[0].TapFile == nil {
				t.Fatalf("NICs %+v", ep.NICs)
			}
			if r := ep.Request; len(r.Interfaces) != 1 || r.Interfaces[0].Mac != podMAC || r.Interfaces[0].Name != "eth0" {
				t.Errorf("request %v", r)
			}
			links := run(t, "ip", "-n", p.ns, "-d", "-o", "link", "show")
			for l, kind := range tc.links {
				line := linkLine(links, l)
				if line == "" {
					t.Errorf("no %s in\n%s", l, links)
				} else if !strings.Contains(line, " "+kind+" ") {
					// `ip -d` names the link's kind in its details.
					t.Errorf("%s is not a %s: %s", l, kind, line)
				}
			}
			if n := strings.Count(links, "\n"); n != len(tc.links)+1 { // + lo
				t.Errorf("%d links, want %d:\n%s", n, len(tc.links)+1, links)
			}
			// eth0 keeps its address (a strict CNI DEL checks it).
			if a := run(t, "ip", "-n", p.ns, "addr", "show", "dev", "eth0"); !strings.Contains(a, podIP+"/24") {
				t.Errorf("eth0 lost its address:\n%s", a)
			}
			if tc.model == ModelTCFilter {
				for _, dev := range []string{"eth0", "tap0_hull"} {
					f := run(t, "tc", "-n", p.ns, "filter", "show", "dev", dev, "ingress")
					other := "tap0_hull"
					if dev == "tap0_hull" {
						other = "eth0"
					}
					if !strings.Contains(f, "pref 49573") || !strings.Contains(f, "Redirect to device "+other) {
						t.Errorf("filter on %s:\n%s", dev, f)
					}
				}
			}

			// The one release path, with this package's releasers; the
			// tap's descriptor is still open (as if QEMU held it).
			if err := state.Release(context.Background(), h, "", state.BuiltinReleasers().With(Releasers())); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(t, p.ns); after != before {
				t.Errorf("namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
			// Releasing again (a second shim delete, hull gc) is a no-op.
			for _, r := range h.State().Resources {
				t.Errorf("still recorded: %s", r)
			}
		})
	}
}

func TestReleasersIdempotent(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	h := newHandle(t)
	ep, err := Setup(Options{Netns: nsPath(p.ns), Recorder: h})
	if err != nil {
		t.Fatal(err)
	}
	recs := h.State().Resources
	ep.Close()
	for range 2 {
		for _, r := range slices.Backward(recs) {
			if err := Releasers()[r.Kind](context.Background(), r); err != nil {
				t.Errorf("releasing %s: %v", r, err)
			}
		}
	}
	// The namespace gone altogether: still released.
	run(t, "ip", "netns", "del", p.ns)
	for _, r := range recs {
		if err := Releasers()[r.Kind](context.Background(), r); err != nil {
			t.Errorf("releasing %s with its netns gone: %v", r, err)
		}
	}
}

func TestSetupBadNetnsPath(t *testing.T) {
	needRoot(t)
	h := newHandle(t)
	path := "/var/run/netns/hullnet-does-not-exist"
	_, err := Setup(Options{Netns: path, Recorder: h})
	if err == nil || !strings.Contains(err.Error(), path) || !errors.Is(err, ErrNetnsGone) {
		t.Fatalf("error %v, want one naming %s", err, path)
	}
	if rs := h.State().Resources; len(rs) != 0 {
		t.Errorf("recorded %v", rs)
	}
	// A file that is not a namespace.
	_, err = Setup(Options{Netns: "/etc/hostname", Recorder: h})
	if err == nil || !strings.Contains(err.Error(), "/etc/hostname") || !strings.Contains(err.Error(), "not a network namespace") {
		t.Fatalf("error %v", err)
	}
}

func TestSetupUnsupportedLink(t *testing.T) {
	needRoot(t)
	// (dummy would do too, where the kernel has the module.)
	for _, tc := range []struct{ kind, typ string }{{"bridge", "bridge"}, {"tap", "tuntap"}} {
		kind := tc.typ
		t.Run(tc.kind, func(t *testing.T) {
			ns := newNetns(t, "hullnet-pod")
			if tc.kind == "tap" {
				// Someone else's tap (a plain tap carries no pod traffic).
				run(t, "ip", "-n", ns, "tuntap", "add", "eth0", "mode", "tap")
			} else {
				run(t, "ip", "-n", ns, "link", "add", "eth0", "type", tc.kind)
			}
			run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
			before := snapshot(t, ns)
			for _, model := range []string{ModelTCFilter, ModelMacvtap} {
				h := newHandle(t)
				_, err := Setup(Options{Netns: nsPath(ns), Model: model, Recorder: h})
				var ule *UnsupportedLinkError
				if !errors.As(err, &ule) || !strings.Contains(err.Error(), "eth0") || !strings.Contains(err.Error(), kind) {
					t.Fatalf("%s: error %v, want one naming eth0 and %s", model, err, kind)
				}
				if rs := h.State().Resources; len(rs) != 0 {
					t.Errorf("recorded %v", rs)
				}
			}
			if after := snapshot(t, ns); after != before {
				t.Errorf("namespace changed:\n%s\n%s", before, after)
			}
		})
	}
}

// TestScanSkipsIdleLinks: a link Hull cannot bridge that is down and has
// no address (the kernel's fallback tunnel tunl0 in every namespace on a
// node with the ipip module; a vxlan stands in for it where the module is
// missing) is left out; once up, it is an unsupported link again.
func TestScanSkipsIdleLinks(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	kind := "ipip"
	if _, err := exec.Command("ip", "-n", p.ns, "link", "add", "tunl9", "type", "ipip", "remote", "10.98.0.1", "local", podIP).CombinedOutput(); err != nil {
		kind = "vxlan"
		run(t, "ip", "-n", p.ns, "link", "add", "tunl9", "type", "vxlan", "id", "9", "dstport", "4789")
	}
	s, err := Scan(nsPath(p.ns))
	if err != nil {
		t.Fatalf("Scan with a down, address-less %s link: %v", kind, err)
	}
	if len(s.Interfaces) != 1 || s.Interfaces[0].Name != "eth0" {
		t.Errorf("Scan found %+v, want eth0 only", s.Interfaces)
	}
	run(t, "ip", "-n", p.ns, "link", "set", "tunl9", "up")
	_, err = Scan(nsPath(p.ns))
	var ule *UnsupportedLinkError
	if !errors.As(err, &ule) || ule.Name != "tunl9" {
		t.Errorf("Scan with tunl9 (%s) up = %v, want an UnsupportedLinkError naming tunl9", kind, err)
	}
}

// TestSetupFailureRollsBack: a second Setup in the same namespace finds
// its tap name taken and must undo what it did, leaving the first intact.
func TestSetupFailureRollsBack(t *testing.T) {
	needRoot(t)
	p := newPod(t)
	h1 := newHandle(t)
	ep, err := Setup(Options{Netns: nsPath(p.ns), Model: ModelMacvtap, Recorder: h1})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	during := snapshot(t, p.ns)
	h2 := newHandle(t)
	if _, err := Setup(Options{Netns: nsPath(p.ns), Model: ModelMacvtap, Recorder: h2}); err == nil {
		t.Fatal("second passthru macvtap on eth0 accepted")
	}
	if rs := h2.State().Resources; len(rs) != 0 {
		t.Errorf("failed setup left records %v", rs)
	}
	if after := snapshot(t, p.ns); after != during {
		t.Errorf("failed setup changed the namespace:\n%s\n%s", during, after)
	}
}

func mapsEqual(a, b map[state.Kind]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
