package podnet

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/leakcheck"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// Runtime handlers of the test's containerd, one per internetworking
// model, each with a ConfigPath that sets runtime.internetworking_model.
const (
	handlerTCFilter = "hull-tcfilter"
	handlerMacvtap  = "hull-macvtap"
	handlerNone     = "hull-none"
)

var models = map[string]string{handlerTCFilter: "tcfilter", handlerMacvtap: "macvtap", handlerNone: "none"}

// env is the test's private containerd, its CRI client and the strict
// CNI plugin's data directory.
type env struct {
	t       *testing.T
	dir     string
	ctd     *harness.Containerd
	cri     *harness.CRI
	configs map[string]string // handler -> hull config file
	strict  string            // strictcni's dataDir (its log is strict/log)
	logRoot string
}

// newEnv builds strictcni into a CNI bin directory of the test (beside
// links to /usr/lib/cni's plugins), writes one hull configuration per
// model and starts containerd with the network bridge + host-local +
// strictcni.
func newEnv(t *testing.T) *env {
	t.Helper()
	dir, err := os.MkdirTemp("", "hull-net-")
	if err != nil {
		t.Fatal(err)
	}
	leakcheck.Register(t, dir)
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{t: t, dir: dir, configs: map[string]string{}, strict: filepath.Join(dir, "strict"), logRoot: filepath.Join(dir, "pods")}
	bin := filepath.Join(dir, "cni-bin")
	for _, d := range []string{bin, e.strict, e.logRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugins, _ := filepath.Glob("/usr/lib/cni/*")
	for _, p := range plugins {
		if err := os.Symlink(p, filepath.Join(bin, filepath.Base(p))); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "strictcni"), "./strictcni").CombinedOutput(); err != nil {
		t.Fatalf("building strictcni: %v\n%s", err, out)
	}
	for handler, model := range models {
		f := filepath.Join(dir, handler+".toml")
		s := fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n\n[agent]\ndial_timeout = 120\n\n[runtime]\ninternetworking_model = %q\n", kernel, initrd, model)
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		e.configs[handler] = f
	}
	opts := harness.Options{
		Dir:          filepath.Join(dir, "ctd"),
		ShimDir:      shimDir,
		HullConfig:   e.configs[handlerTCFilter],
		HullHandlers: e.configs,
		CNIBinDir:    bin,
		CNIChain:     []string{fmt.Sprintf(`{"type": "strictcni", "dataDir": %q}`, e.strict)},
	}
	strictLog := func() string { return "strictcni log:\n" + e.strictLog() }
	e.ctd, e.cri = harness.LaunchT(t, opts, 60, strictLog, harness.CRINamespace, "default")
	return e
}

func (e *env) strictLog() string {
	b, _ := os.ReadFile(filepath.Join(e.strict, "log"))
	return string(b)
}

// ctx is a context bounded by limit, cancelled when the test ends.
func (e *env) ctx(limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	e.t.Cleanup(cancel)
	return ctx
}

// dnsServer answers A queries for one name with one address over UDP,
// from a socket in the network namespace nsPath: enough for a pod to
// resolve a name through the nameserver its CRI resolv.conf names. AAAA
// queries for the name get no answer; other names NXDOMAIN.
type dnsServer struct {
	conn *net.UDPConn
	name string // lower case, without the final dot
	ip   net.IP
}

func startDNS(nsPath, addr, name string, ip net.IP) (*dnsServer, error) {
	s := &dnsServer{name: strings.ToLower(strings.TrimSuffix(name, ".")), ip: ip.To4()}
	err := harness.InNetns(nsPath, func() error {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
		s.conn = c
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening for DNS on %s in %s: %w", addr, nsPath, err)
	}
	go s.serve()
	return s, nil
}

func (s *dnsServer) Close() { s.conn.Close() }

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if resp, err := s.answer(buf[:n]); err == nil {
			s.conn.WriteToUDP(resp, from)
		}
	}
}

// answer builds the response to one query (RFC 1035 4.1).
func (s *dnsServer) answer(q []byte) ([]byte, error) {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil, errors.New("not a one-question query")
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l&0xc0 != 0 || i+1+l > len(q) {
			return nil, errors.New("bad name")
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil, errors.New("short question")
	}
	qend := i + 5 // the zero label, QTYPE, QCLASS
	qtype := binary.BigEndian.Uint16(q[i+1:])
	name := strings.ToLower(strings.Join(labels, "."))
	resp := append([]byte{}, q[:qend]...)
	flags := uint16(0x8180) // QR, RD, RA, NOERROR
	ancount := uint16(0)
	switch {
	case name != s.name:
		flags |= 3 // NXDOMAIN
	case qtype == 1:
		ancount = 1
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		resp = append(resp, s.ip...)
	}
	binary.BigEndian.PutUint16(resp[2:], flags)
	binary.BigEndian.PutUint16(resp[6:], ancount)
	binary.BigEndian.PutUint16(resp[8:], 0)
	binary.BigEndian.PutUint16(resp[10:], 0)
	return resp, nil
}
