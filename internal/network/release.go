package network

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hull-runtime/hull/internal/state"
)

// Releasers are this package's state releasers (internal/releasers
// gathers them with the others).
func Releasers() state.Releasers {
	return state.Releasers{
		state.KindTap:      ReleaseTap,
		state.KindTCFilter: ReleaseTCFilter,
		state.KindMacvtap:  ReleaseMacvtap,
	}
}

// openRecorded opens r's namespace; nil (and no error) when it is gone or
// is no longer the namespace the record was made in.
func openRecorded(r state.Resource) (*nsHandle, error) {
	h, err := openNetns(r.Netns)
	if errors.Is(err, ErrNetnsGone) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if id := r.Data[dataNetnsID]; id != "" && id != h.id {
		h.Close()
		return nil, nil
	}
	return h, nil
}

// linkOf returns r's link if it is still there and of kind typ; nil
// when it is gone or someone else's.
func linkOf(h *nsHandle, name, typ string) (netlink.Link, error) {
	// ip link show dev <name>
	l, err := h.nl.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("finding %s in %s: %w", name, h.path, err)
	}
	if typ != "" && l.Type() != typ {
		return nil, nil // not ours: a link of another kind took the name
	}
	return l, nil
}

// deleteLink releases a tap or macvtap of Hull's.
func deleteLink(r state.Resource, typ string) error {
	h, err := openRecorded(r)
	if h == nil || err != nil {
		return err
	}
	defer h.Close()
	l, err := linkOf(h, r.Link, typ)
	if l == nil || err != nil {
		return err
	}
	// ip link del dev <name>
	if err := h.nl.LinkDel(l); err != nil && !gone(err) {
		return fmt.Errorf("deleting %s in %s: %w", r.Link, h.path, err)
	}
	return nil
}

// ReleaseTap deletes a tap of Hull's (state.KindTap).
func ReleaseTap(_ context.Context, r state.Resource) error { return deleteLink(r, "tuntap") }

// ReleaseMacvtap deletes a macvtap of Hull's (state.KindMacvtap).
func ReleaseMacvtap(_ context.Context, r state.Resource) error { return deleteLink(r, "macvtap") }

// ReleaseTCFilter removes Hull's redirect filter from r.Link, and the
// ingress qdisc if Hull added it (state.KindTCFilter).
func ReleaseTCFilter(_ context.Context, r state.Resource) error {
	h, err := openRecorded(r)
	if h == nil || err != nil {
		return err
	}
	defer h.Close()
	l, err := linkOf(h, r.Link, "")
	if l == nil || err != nil {
		return err
	}
	if r.Data[dataQdisc] == qdiscCreated {
		// tc qdisc del dev <link> ingress (its filters go with it)
		err := h.nl.QdiscDel(&netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: l.Attrs().Index, Handle: ingressHandle, Parent: netlink.HANDLE_INGRESS,
		}})
		if err != nil && !gone(err) {
			return fmt.Errorf("deleting the ingress qdisc of %s in %s: %w", r.Link, h.path, err)
		}
		return nil
	}
	prio, err := strconv.ParseUint(r.Data[dataPrio], 10, 16)
	if err != nil {
		return fmt.Errorf("tc filter on %s: bad recorded prio %q", r.Link, r.Data[dataPrio])
	}
	// tc filter del dev <link> parent ffff: prio <prio> protocol all
	err = h.nl.FilterDel(&netlink.U32{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: l.Attrs().Index, Parent: ingressHandle, Priority: uint16(prio), Protocol: unix.ETH_P_ALL,
	}})
	if err != nil && !gone(err) {
		return fmt.Errorf("deleting hull's filter on %s in %s: %w", r.Link, h.path, err)
	}
	return nil
}

// gone says whether a delete failed because the thing was not there.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, os.ErrNotExist)
}
