// Command strictcni is a CNI plugin for Hull's end-to-end tests, chained
// after bridge: it is as strict on DEL as Calico is, and stricter.
//
// ADD passes the previous result through and records, per container, the
// addresses the result gave CNI_IFNAME and a snapshot of the pod's
// network namespace (links, addresses, routes, qdiscs, ingress filters).
// DEL fails unless CNI_IFNAME still carries every recorded address and
// the namespace is exactly as ADD left it: a runtime that moved the
// address into a VM, or left a tap, a macvtap or a tc filter behind,
// cannot tear its pod down. Each ADD and DEL appends a line to
// <dataDir>/log, which the tests read.
//
// Configuration: {"type": "strictcni", "dataDir": "<dir>"}.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

type config struct {
	CNIVersion string          `json:"cniVersion"`
	Name       string          `json:"name"`
	DataDir    string          `json:"dataDir"`
	PrevResult json.RawMessage `json:"prevResult,omitempty"`
}

// result is the part of a CNI 0.4/1.0 result strictcni reads.
type result struct {
	Interfaces []struct {
		Name    string `json:"name"`
		Sandbox string `json:"sandbox"`
	} `json:"interfaces"`
	IPs []struct {
		Address   string `json:"address"`
		Interface *int   `json:"interface"`
	} `json:"ips"`
}

// record is what ADD saw, kept in <dataDir>/<container id>.json.
type record struct {
	Netns    string   `json:"netns"`
	Ifname   string   `json:"ifname"`
	Addrs    []string `json:"addrs"`
	Snapshot []string `json:"snapshot"`
}

func main() {
	cmd := os.Getenv("CNI_COMMAND")
	if cmd == "VERSION" {
		fmt.Println(`{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}`)
		return
	}
	in, err := io.ReadAll(os.Stdin)
	var conf config
	if err == nil {
		err = json.Unmarshal(in, &conf)
	}
	if err != nil {
		fail(conf, "", fmt.Errorf("reading the network configuration: %w", err))
	}
	id := os.Getenv("CNI_CONTAINERID")
	switch cmd {
	case "ADD":
		err = add(conf, id)
	case "DEL":
		err = del(conf, id, true)
	case "CHECK":
		err = del(conf, id, false)
	default:
		err = fmt.Errorf("unknown CNI_COMMAND %q", cmd)
	}
	if err != nil {
		fail(conf, cmd+" "+id, err)
	}
}

// fail logs err, prints it as a CNI error and exits 1.
func fail(conf config, what string, err error) {
	logf(conf, "%s FAIL: %v", what, err)
	json.NewEncoder(os.Stdout).Encode(map[string]any{
		"cniVersion": conf.CNIVersion, "code": 100, "msg": "strictcni: " + err.Error(),
	})
	os.Exit(1)
}

func logf(conf config, format string, args ...any) {
	if conf.DataDir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(conf.DataDir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

func add(conf config, id string) error {
	if conf.DataDir == "" || id == "" {
		return errors.New("dataDir and CNI_CONTAINERID are required")
	}
	if len(conf.PrevResult) == 0 {
		return errors.New("no prevResult: strictcni must be chained after a plugin that makes the interface")
	}
	var prev result
	if err := json.Unmarshal(conf.PrevResult, &prev); err != nil {
		return fmt.Errorf("parsing prevResult: %w", err)
	}
	ifname, nsPath := os.Getenv("CNI_IFNAME"), os.Getenv("CNI_NETNS")
	rec := record{Netns: nsPath, Ifname: ifname}
	for _, ip := range prev.IPs {
		if ip.Interface == nil || *ip.Interface >= len(prev.Interfaces) {
			continue
		}
		if ifc := prev.Interfaces[*ip.Interface]; ifc.Name == ifname && ifc.Sandbox != "" {
			rec.Addrs = append(rec.Addrs, ip.Address)
		}
	}
	if len(rec.Addrs) == 0 {
		return fmt.Errorf("prevResult gives %s no address", ifname)
	}
	h, err := open(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := carries(h, ifname, rec.Addrs); err != nil {
		return err
	}
	if rec.Snapshot, err = snapshot(h); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := os.WriteFile(filepath.Join(conf.DataDir, id+".json"), b, 0o644); err != nil {
		return err
	}
	logf(conf, "ADD %s %s %s", id, ifname, strings.Join(rec.Addrs, ","))
	// The result is the previous one, unchanged.
	var out map[string]any
	if err := json.Unmarshal(conf.PrevResult, &out); err != nil {
		return err
	}
	out["cniVersion"] = conf.CNIVersion
	return json.NewEncoder(os.Stdout).Encode(out)
}

// del checks the namespace against ADD's record (and forgets it if
// forget).
func del(conf config, id string, forget bool) error {
	file := filepath.Join(conf.DataDir, id+".json")
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		// Never added, or deleted already: DEL is idempotent.
		logf(conf, "DEL %s no-record", id)
		return nil
	}
	if err != nil {
		return err
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	nsPath := os.Getenv("CNI_NETNS")
	if nsPath == "" {
		return fmt.Errorf("no network namespace to check: %s of container %s cannot be verified", rec.Ifname, id)
	}
	h, err := open(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := carries(h, rec.Ifname, rec.Addrs); err != nil {
		return err
	}
	now, err := snapshot(h)
	if err != nil {
		return err
	}
	if d := diff(rec.Snapshot, now); d != "" {
		return fmt.Errorf("the network namespace %s is not as ADD left it:\n%s", nsPath, d)
	}
	if forget {
		if err := os.Remove(file); err != nil {
			return err
		}
		logf(conf, "DEL %s ok", id)
	} else {
		logf(conf, "CHECK %s ok", id)
	}
	return nil
}

func open(nsPath string) (*netlink.Handle, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	return h, nil
}

// carries fails unless ifname has every address of addrs (ip addr show dev
// <ifname>).
func carries(h *netlink.Handle, ifname string, addrs []string) error {
	l, err := h.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("%s is gone: %w", ifname, err)
	}
	have, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return err
	}
	for _, want := range addrs {
		ip, ipn, err := net.ParseCIDR(want)
		if err != nil {
			return err
		}
		ipn.IP = ip
		if !slices.ContainsFunc(have, func(a netlink.Addr) bool { return a.IPNet.String() == ipn.String() }) {
			return fmt.Errorf("%s no longer carries %s, the address ADD gave it", ifname, want)
		}
	}
	return nil
}

// snapshot describes the namespace but for loopback: links (ip -d link), addresses (ip
// addr, IPv6 link-local left out), main-table routes (ip route), qdiscs
// (tc qdisc) and ingress filters (tc filter show ingress).
func snapshot(h *netlink.Handle) ([]string, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		if a.Flags&net.FlagLoopback != 0 {
			// The loopback plugin's: its DEL, which runs first, takes lo down.
			continue
		}
		out = append(out, fmt.Sprintf("link %s type=%s mac=%s mtu=%d up=%t promisc=%t master=%d",
			a.Name, l.Type(), a.HardwareAddr, a.MTU, a.Flags&net.FlagUp != 0, a.Promisc != 0, a.MasterIndex))
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, err
		}
		for _, ad := range addrs {
			if ad.IP.To4() == nil && ad.IP.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, fmt.Sprintf("addr %s %s", a.Name, ad.IPNet))
		}
		qdiscs, err := h.QdiscList(l)
		if err != nil {
			return nil, err
		}
		for _, q := range qdiscs {
			qa := q.Attrs()
			out = append(out, fmt.Sprintf("qdisc %s %s handle=%x parent=%x", a.Name, q.Type(), qa.Handle, qa.Parent))
			if qa.Parent == netlink.HANDLE_INGRESS {
				fs, err := h.FilterList(l, netlink.MakeHandle(0xffff, 0))
				if err != nil {
					return nil, err
				}
				for _, f := range fs {
					out = append(out, fmt.Sprintf("filter %s ingress %s prio=%d", a.Name, f.Type(), f.Attrs().Priority))
				}
			}
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 254}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.To4() == nil && r.Dst.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, fmt.Sprintf("route dst=%v gw=%v dev=%s proto=%d scope=%d", r.Dst, r.Gw, names[r.LinkIndex], r.Protocol, r.Scope))
	}
	slices.Sort(out)
	return out, nil
}

// diff lists the lines only in a (-) or only in b (+).
func diff(a, b []string) string {
	var d []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			d = append(d, "  - "+x)
		}
	}
	for _, x := range b {
		if !slices.Contains(a, x) {
			d = append(d, "  + "+x)
		}
	}
	return strings.Join(d, "\n")
}
