package podnet

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// checkPlumbing checks, while the pod runs, that its model's links and
// filters (and nothing else of Hull's) are in the pod netns, that eth0
// keeps the pod IP, and that the guest's eth0 has eth0's MAC, MTU,
// address and default route (none: only lo).
func (e *env) checkPlumbing(t *testing.T, ctx context.Context, p *netPod) {
	h := p.nl(t)
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in the pod netns: %v", err)
	}
	if !hasAddr(t, h, eth0, p.ip) {
		t.Errorf("eth0 in the pod netns lost the pod IP %s", p.ip)
	}
	byName := map[string]netlink.Link{}
	links, _ := h.LinkList()
	for _, l := range links {
		byName[l.Attrs().Name] = l
	}
	ea := eth0.Attrs()
	switch p.handler {
	case handlerTCFilter:
		tap := byName["tap0_hull"]
		if tap == nil || tap.Type() != "tuntap" || tap.Attrs().MTU != ea.MTU {
			t.Errorf("want tap0_hull (tuntap, MTU %d) in the pod netns, have %v", ea.MTU, describe(links))
		}
		for _, l := range []netlink.Link{eth0, tap} {
			if l != nil && !hasHullFilter(t, h, l) {
				t.Errorf("no hull redirect filter (prio %d) on the ingress of %s", hullFilterPrio, l.Attrs().Name)
			}
		}
	case handlerMacvtap:
		mv := byName["mvtap0_hull"]
		if mv == nil || mv.Type() != "macvtap" || mv.Attrs().ParentIndex != ea.Index || mv.Attrs().HardwareAddr.String() != ea.HardwareAddr.String() {
			t.Errorf("want mvtap0_hull (macvtap on eth0 with its MAC %s) in the pod netns, have %v", ea.HardwareAddr, describe(links))
		}
	default:
		if left := hullLeftovers(t, h); len(left) > 0 {
			t.Errorf("model %s: Hull's plumbing in the pod netns: %v", p.handler, left)
		}
	}
	if p.handler == harness.HandlerRunc {
		return
	}
	if !p.networked() {
		if got := execOut(t, ctx, e, p, "ls", "/sys/class/net"); got != "lo" {
			t.Errorf("guest network interfaces = %q, want only lo (model none)", got)
		}
		return
	}
	if got := execOut(t, ctx, e, p, "cat", "/sys/class/net/eth0/address"); got != ea.HardwareAddr.String() {
		t.Errorf("guest eth0 MAC = %q, want the pod netns eth0's %s", got, ea.HardwareAddr)
	}
	if got := execOut(t, ctx, e, p, "cat", "/sys/class/net/eth0/mtu"); got != strconv.Itoa(ea.MTU) {
		t.Errorf("guest eth0 MTU = %q, want %d", got, ea.MTU)
	}
	if got := execOut(t, ctx, e, p, "ip", "-o", "-4", "addr", "show", "dev", "eth0"); !strings.Contains(got, " "+p.ip+"/16 ") {
		t.Errorf("guest eth0 addresses %q lack %s/16", got, p.ip)
	}
	// IPv6 link-local: the pod's, and no other (a VM restored from a
	// template must not show one derived from its template's MAC).
	if got, want := guestLinkLocal(t, execOut(t, ctx, e, p, "cat", "/proc/net/if_inet6")), linkLocal(t, h, eth0); !slices.Equal(got, want) {
		t.Errorf("guest eth0 link-local addresses %q, want the pod netns eth0's %q", got, want)
	}
	if got := execOut(t, ctx, e, p, "ip", "route"); !strings.Contains(got, "default via "+dnsServerIP+" dev eth0") {
		t.Errorf("guest routes %q lack the default route via %s", got, dnsServerIP)
	}
	if got := execOut(t, ctx, e, p, "cat", "/sys/class/net/lo/operstate", "/sys/class/net/lo/flags"); !strings.Contains(got, "0x9") {
		t.Errorf("guest lo is not up: %q", got)
	}
}

// linkLocal is l's IPv6 link-local addresses, sorted.
func linkLocal(t *testing.T, h *netlink.Handle, l netlink.Link) []string {
	addrs, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Errorf("IPv6 addresses of %s: %v", l.Attrs().Name, err)
	}
	var ll []string
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			ll = append(ll, a.IP.String())
		}
	}
	slices.Sort(ll)
	return ll
}

// guestLinkLocal is eth0's IPv6 link-local addresses in the guest's
// /proc/net/if_inet6 (its fields joined by spaces: address in 32 hex
// digits, index, prefix length, scope, flags, device), sorted.
func guestLinkLocal(t *testing.T, ifInet6 string) []string {
	f := strings.Fields(ifInet6)
	var ll []string
	for i := 0; i+5 < len(f); i += 6 {
		b, err := hex.DecodeString(f[i])
		if err != nil || len(b) != net.IPv6len {
			t.Errorf("guest /proc/net/if_inet6: bad address %q", f[i])
			continue
		}
		if ip := net.IP(b); f[i+5] == "eth0" && ip.IsLinkLocalUnicast() {
			ll = append(ll, ip.String())
		}
	}
	slices.Sort(ll)
	return ll
}

func execOut(t *testing.T, ctx context.Context, e *env, p *netPod, cmd ...string) string {
	t.Helper()
	out, stderr, code, err := e.cri.Exec(ctx, p.web, 30*time.Second, cmd...)
	if err != nil || code != 0 {
		t.Errorf("pod %s: %q: exit %d, %v, stderr %q", p.handler, cmd, code, err, stderr)
	}
	return strings.Join(strings.Fields(out), " ")
}

func hasAddr(t *testing.T, h *netlink.Handle, l netlink.Link, ip string) bool {
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Errorf("addresses of %s: %v", l.Attrs().Name, err)
	}
	for _, a := range addrs {
		if a.IP.String() == ip {
			return true
		}
	}
	return false
}

// hasHullFilter: tc filter show dev <l> ingress has Hull's priority.
func hasHullFilter(t *testing.T, h *netlink.Handle, l netlink.Link) bool {
	fs, err := h.FilterList(l, netlink.MakeHandle(0xffff, 0))
	if err != nil {
		t.Errorf("ingress filters of %s: %v", l.Attrs().Name, err)
	}
	for _, f := range fs {
		if f.Attrs().Priority == hullFilterPrio {
			return true
		}
	}
	return false
}

// hullLeftovers lists Hull's links (named *_hull, or any tap or
// macvtap) and every ingress qdisc in a pod netns: CNI's bridge plugin
// makes neither.
func hullLeftovers(t *testing.T, h *netlink.Handle) []string {
	links, err := h.LinkList()
	if err != nil {
		t.Fatalf("listing links: %v", err)
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if strings.HasSuffix(a.Name, "_hull") || l.Type() == "tuntap" || l.Type() == "macvtap" {
			out = append(out, fmt.Sprintf("link %s (%s)", a.Name, l.Type()))
		}
		qs, err := h.QdiscList(l)
		if err != nil {
			t.Errorf("qdiscs of %s: %v", a.Name, err)
		}
		for _, q := range qs {
			if q.Attrs().Parent == netlink.HANDLE_INGRESS {
				out = append(out, fmt.Sprintf("ingress qdisc on %s", a.Name))
			}
		}
	}
	return out
}

func describe(links []netlink.Link) string {
	var s []string
	for _, l := range links {
		s = append(s, l.Attrs().Name+"("+l.Type()+")")
	}
	return strings.Join(s, " ")
}

// strictFailsWithoutAddress takes eth0's address (and so the routes
// through it) away in p's netns: StopPodSandbox must fail in strictcni's
// DEL. The address and routes are then restored, for Teardown.
func (e *env) strictFailsWithoutAddress(t *testing.T, ctx context.Context, p *netPod) {
	h := p.nl(t)
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	// ip route show table main
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("eth0 addresses: %v, %v", addrs, err)
	}
	for _, a := range addrs {
		// ip addr del <a> dev eth0
		if err := h.AddrDel(eth0, &a); err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: p.pod.ID})
	if err == nil || !strings.Contains(err.Error(), "no longer carries") {
		t.Errorf("StopPodSandbox with eth0's address gone = %v; want strictcni's DEL error (\"eth0 no longer carries ...\")", err)
	} else {
		t.Logf("as wanted, StopPodSandbox failed: %v", err)
	}
	for _, a := range addrs {
		// ip addr add <a> dev eth0
		if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: a.IPNet}); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range routes {
		if r.Protocol != unix.RTPROT_KERNEL {
			// ip route replace <r>
			if err := h.RouteReplace(&r); err != nil {
				t.Fatalf("restoring route %v: %v", r, err)
			}
		}
	}
}

// teardown stops p (no error: strictcni's DEL found the namespace as ADD
// left it), checks the namespace holds nothing of Hull's, removes the pod
// and checks that nothing of it is left on the host.
func (e *env) teardown(t *testing.T, p *netPod) {
	ctx := e.ctx(3 * time.Minute)
	ids, _ := e.cri.PodContainers(ctx, p.pod.ID)
	ids = append(ids, p.pod.ID)
	start := time.Now()
	if _, err := e.cri.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: p.pod.ID}); err != nil {
		t.Errorf("StopPodSandbox: %v", err)
	}
	stopped := time.Since(start)
	if !strings.Contains(e.strictLog(), "DEL "+p.pod.ID+" ok") {
		t.Errorf("strictcni logged no successful DEL of %s:\n%s", p.pod.ID, e.strictLog())
	}
	h := p.nl(t)
	if left := hullLeftovers(t, h); len(left) > 0 {
		t.Errorf("after StopPodSandbox, left in the pod netns: %v", left)
	}
	links, _ := h.LinkList()
	h.Close()
	if _, err := e.cri.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: p.pod.ID}); err != nil {
		t.Errorf("RemovePodSandbox: %v", err)
	}
	t.Logf("stopped in %v, removed in %v; links left in the (held) netns after CNI DEL: %s",
		stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), describe(links))
	for _, err := range e.ctd.Residue(10*time.Second, ids, p.netns) {
		t.Errorf("after RemovePodSandbox: %v", err)
	}
	e.noSteeringLeft(t, p)
	p.nsFile.Close()
	p.nsFile = nil
}

// ctrRunHull runs `ctr run --rm` of the hull runtime (tcfilter config)
// with the network namespace nsPath, and checks it fails with an error
// containing every one of want and leaves nothing behind.
func (e *env) ctrRunHull(t *testing.T, ctx context.Context, nsPath string, want ...string) {
	id := "netbad-" + randomHex(4)
	out, err := e.ctd.Ctr(ctx, "--namespace", "default", "run", "--rm", "--runtime", harness.HullRuntimeType,
		"--fifo-dir", t.TempDir(), "--runtime-config-path", e.ctd.HandlerConfig(handlerTCFilter),
		"--with-ns", "network:"+nsPath, harness.BusyboxImage, id, "true")
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Errorf("ctr run with network namespace %s: %v, want a failure; output:\n%s", nsPath, err, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("ctr run error lacks %q:\n%s", w, out)
		}
	}
	t.Logf("ctr run: %s", strings.TrimSpace(out))
	// ctr run --rm leaves the container record when the task never
	// started: that is ctr's, not the runtime's; remove it.
	if ls, _ := e.ctd.Ctr(ctx, "--namespace", "default", "containers", "ls", "-q"); strings.Contains(ls, id) {
		e.ctd.Ctr(ctx, "--namespace", "default", "containers", "rm", id)
	}
	for _, err := range e.ctd.Residue(10*time.Second, []string{id}) {
		t.Errorf("after the failed ctr run: %v", err)
	}
	if p := e.ctd.ShimProcesses(shimName); len(p) != 0 {
		t.Errorf("hull shims still running: %v", p)
	}
}

func (e *env) nonexistentNetns(t *testing.T, ctx context.Context) {
	path := "/nonexistent/netns-" + randomHex(4)
	e.ctrRunHull(t, ctx, path, path, "does not exist")
}

// unbridgeable runs a hull container in a netns of the test whose eth0 is
// a link of kind (bridge, tuntap): the error names eth0 and its
// kind, and the namespace is unchanged.
func (e *env) unbridgeable(t *testing.T, ctx context.Context, kind string) {
	name := "hull-net-bad-" + randomHex(4)
	ip(t, "netns", "add", name)
	defer ip(t, "netns", "del", name)
	switch kind {
	case "tuntap":
		ip(t, "-n", name, "tuntap", "add", "dev", "eth0", "mode", "tap")
	default:
		ip(t, "-n", name, "link", "add", "eth0", "type", kind)
	}
	ip(t, "-n", name, "addr", "add", "10.99.0.2/24", "dev", "eth0")
	ip(t, "-n", name, "link", "set", "eth0", "up")
	ip(t, "-n", name, "link", "set", "lo", "up")
	before := nsDump(t, name)
	e.ctrRunHull(t, ctx, "/run/netns/"+name, "eth0", "type "+kind, "cannot be bridged")
	if after := nsDump(t, name); after != before {
		t.Errorf("the namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// nsDump: ip -d link; ip addr; ip route; tc qdisc; tc filter on ingress.
func nsDump(t *testing.T, ns string) string {
	var b bytes.Buffer
	for _, args := range [][]string{
		{"ip", "-n", ns, "link", "show"}, // (not -d: a bridge's timers tick)
		{"ip", "-n", ns, "addr", "show"},
		{"ip", "-n", ns, "route", "show", "table", "all"},
		{"tc", "-n", ns, "qdisc", "show"},
		{"tc", "-n", ns, "filter", "show", "dev", "eth0", "ingress"},
	} {
		out, _ := exec.Command(args[0], args[1:]...).CombinedOutput()
		b.Write(out)
	}
	return b.String()
}
