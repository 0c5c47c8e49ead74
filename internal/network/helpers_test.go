package network

import (
	"crypto/rand"
	"encoding/hex"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/state"

	"github.com/hull-runtime/hull/internal/testenv"
)

// needRoot skips tests that create namespaces and links.
func needRoot(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.Root("network namespaces, veth, tap, tc"), testenv.Bins("ip", "tc"))
}

// run runs a command, failing the test (with its output) on error, and
// returns its standard output alone: `ip` writes warnings to stderr (e.g.
// "Peer netns reference is invalid." when another test's namespace is
// being deleted while it names the namespaces of link peers), which are
// not lines of its listings.
func run(t *testing.T, args ...string) string {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// newNetns adds a named network namespace (ip netns add) removed at the
// end of the test, and returns its name.
func newNetns(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := prefix + "-" + hex.EncodeToString(b)
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return name
}

func nsPath(name string) string { return "/var/run/netns/" + name }

// pod is a pod namespace as the bridge CNI plugin would leave it: eth0 (a
// veth) with IPv4 and IPv6 addresses, default routes, an extra route and
// a permanent neighbour; its peer veth0 is in a namespace of its own.
type pod struct {
	ns, peer string
}

const (
	podIP    = "10.99.0.2"
	peerIP   = "10.99.0.1"
	podIP6   = "fd99::2"
	podMAC   = "02:99:00:00:00:02"
	podMTU   = "1400"
	neighIP  = "10.99.0.7"
	neighMAC = "02:99:00:00:00:07"
)

func newPod(t *testing.T) pod {
	t.Helper()
	p := pod{ns: newNetns(t, "hullnet-pod"), peer: newNetns(t, "hullnet-peer")}
	// No IPv6 duplicate address detection: the link-local address (and
	// its local route) would appear at a random time between snapshots.
	for _, ns := range []string{p.ns, p.peer} {
		run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
	}
	// Made inside the pod namespace: a host link called eth0 is never touched.
	run(t, "ip", "-n", p.ns, "link", "add", "eth0", "address", podMAC, "mtu", podMTU, "type", "veth", "peer", "name", "veth0", "netns", p.peer)
	run(t, "ip", "-n", p.ns, "link", "set", "eth0", "up")
	run(t, "ip", "-n", p.ns, "addr", "add", podIP+"/24", "dev", "eth0")
	run(t, "ip", "-n", p.ns, "addr", "add", podIP6+"/64", "dev", "eth0", "nodad")
	run(t, "ip", "-n", p.ns, "route", "add", "default", "via", peerIP, "dev", "eth0")
	run(t, "ip", "-n", p.ns, "route", "add", "10.200.0.0/16", "via", "10.99.0.254", "dev", "eth0", "metric", "7")
	run(t, "ip", "-n", p.ns, "-6", "route", "add", "default", "via", "fd99::1", "dev", "eth0")
	run(t, "ip", "-n", p.ns, "neigh", "add", neighIP, "lladdr", neighMAC, "dev", "eth0", "nud", "permanent")
	run(t, "ip", "-n", p.peer, "link", "set", "veth0", "mtu", podMTU, "up")
	run(t, "ip", "-n", p.peer, "addr", "add", peerIP+"/24", "dev", "veth0")
	run(t, "ip", "-n", p.peer, "addr", "add", "fd99::1/64", "dev", "veth0", "nodad")
	return p
}

// snapshot is everything CNI DEL and a careful admin could look at in ns.
func snapshot(t *testing.T, ns string) string {
	t.Helper()
	var b strings.Builder
	for _, c := range [][]string{
		{"ip", "-n", ns, "-d", "link", "show"},
		{"ip", "-n", ns, "addr", "show"},
		{"ip", "-n", ns, "route", "show", "table", "all"},
		{"ip", "-n", ns, "-6", "route", "show", "table", "all"},
		{"ip", "-n", ns, "neigh", "show", "nud", "permanent"},
		{"tc", "-n", ns, "qdisc", "show"},
		{"tc", "-n", ns, "filter", "show", "dev", "eth0", "ingress"},
	} {
		b.WriteString("$ " + strings.Join(c, " ") + "\n" + run(t, c...))
	}
	// What changes by itself: bridge timers, IPv6 duplicate address
	// detection finishing.
	out := timerRE.ReplaceAllString(b.String(), "$1 <t>")
	return strings.ReplaceAll(out, " tentative", "")
}

var timerRE = regexp.MustCompile(`(\w+_timer)\s+[0-9.]+`)

func newHandle(t *testing.T) *state.Handle {
	t.Helper()
	s := &state.Store{Root: t.TempDir()}
	h, err := s.Create("sb", state.Sandbox{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

type SetupNetworkRequestAlias = agentapi.SetupNetworkRequest

type nopRecorder struct{}

func (nopRecorder) Record(state.Resource) error     { return nil }
func (nopRecorder) Forget(state.Kind, string) error { return nil }
