package network

import (
	"net"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/vm"
)

// BuildRequest is the agent's SetupNetworkRequest for a scanned
// namespace whose interfaces got nics (same order; a NIC's MAC is the one
// the guest sees). Interfaces without a NIC are left out, with their
// routes and neighbours.
func BuildRequest(ns *Netns, nics []vm.NIC) *agentapi.SetupNetworkRequest {
	req := &agentapi.SetupNetworkRequest{}
	if ns == nil {
		return req
	}
	have := map[string]bool{}
	for i, ifc := range ns.Interfaces {
		if i >= len(nics) {
			break
		}
		have[ifc.Name] = true
		in := &agentapi.NetInterface{Name: ifc.Name, Mac: nics[i].MAC.String(), Mtu: uint32(ifc.MTU)}
		for _, a := range ifc.Addrs {
			in.Addresses = append(in.Addresses, a.String())
		}
		req.Interfaces = append(req.Interfaces, in)
	}
	str := func(ip net.IP) string {
		if ip == nil {
			return ""
		}
		return ip.String()
	}
	for _, r := range ns.Routes {
		if !have[r.Dev] {
			continue
		}
		dst := ""
		if r.Dst != nil {
			dst = r.Dst.String()
		}
		req.Routes = append(req.Routes, &agentapi.NetRoute{
			Dest: dst, Gateway: str(r.Gw), Device: r.Dev, Source: str(r.Src),
			Scope: uint32(r.Scope), Metric: uint32(r.Metric), Family: uint32(r.Family),
		})
	}
	for _, n := range ns.Neighbors {
		if have[n.Dev] {
			req.Neighbors = append(req.Neighbors, &agentapi.NetNeighbor{Ip: n.IP.String(), Mac: n.MAC.String(), Device: n.Dev})
		}
	}
	return req
}
