// Package network connects a pod's VM to the network namespace CNI built
// for the pod, without changing what CNI made.
//
// Setup scans the namespace (Scan) and, per interface, adds Hull's own
// plumbing as the internetworking model says:
//
//   - tcfilter (default): a tap device tap<i>_hull with the interface's
//     MTU, an ingress qdisc on both, and a tc u32 match-all filter on each
//     redirecting every frame to the other (mirred egress redirect). The VM
//     NIC sits on the tap with the interface's MAC.
//   - macvtap: a macvtap mvtap<i>_hull in passthru mode on the interface.
//     Passthru delivers every frame the interface receives to the VM and
//     inherits the interface's MAC, which the VM NIC uses: the pod IP's ARP
//     answer (from the guest or from the interface, which keeps its
//     address) names the one MAC whose frames reach the guest. Bridge mode
//     would need a second MAC and moving the address into the VM — the
//     Kata failure where a strict CNI DEL no longer finds the address.
//   - none: no NIC.
//
// The interface keeps its addresses, routes and MAC: CNI DEL finds it as it
// left it. What Hull adds to a CNI link is only transient: the ingress
// qdisc (tcfilter; removed at teardown if Hull added it, otherwise only
// Hull's filter is removed) and the promiscuity count that a passthru
// macvtap holds (dropped when the macvtap is deleted).
//
// Every resource is recorded (Recorder) before it is created and released
// by this package's Releasers (gathered in internal/releasers) for
// KindTap, KindTCFilter and KindMacvtap: the one release path of a sandbox
// removes exactly what Setup added, and treats what is gone (the
// namespace included) as released.
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/rollback"
	"github.com/hull-runtime/hull/internal/state"
	"github.com/hull-runtime/hull/internal/vm"
)

// Internetworking models (the runtime.internetworking_model values).
const (
	ModelTCFilter = "tcfilter"
	ModelMacvtap  = "macvtap"
	ModelNone     = "none"
)

// Models lists the models Setup accepts; "" means ModelTCFilter.
var Models = []string{ModelTCFilter, ModelMacvtap, ModelNone}

// ErrInvalidModel is wrapped by the error for an unknown model.
var ErrInvalidModel = errors.New("invalid internetworking model")

// CheckModel returns the model to use for m ("" is the default).
func CheckModel(m string) (string, error) {
	if m == "" {
		return ModelTCFilter, nil
	}
	if !slices.Contains(Models, m) {
		return "", fmt.Errorf("%w %q: must be one of %v", ErrInvalidModel, m, Models)
	}
	return m, nil
}

// Recorder persists resources before they are acquired; *state.Handle
// is one.
type Recorder interface {
	Record(state.Resource) error
	Forget(kind state.Kind, key string) error
}

// Options describe a sandbox's network.
type Options struct {
	// Netns is the pod's network namespace path (the OCI spec's network
	// namespace). Empty: the pod has no network namespace of its own; the
	// VM gets no NIC.
	Netns string
	// Model is an internetworking model; "" is ModelTCFilter.
	Model    string
	Recorder Recorder
	Log      *slog.Logger
}

// Endpoint is a sandbox's network once Setup has built it.
type Endpoint struct {
	Model string
	// Scanned is what CNI built (nil for ModelNone or no namespace).
	Scanned *Netns
	// NICs go into vm.Config.NICs; their TapFiles stay open until Close.
	NICs []vm.NIC
	// Request is what the agent applies (SetupNetwork) once the VM is up.
	Request *agentapi.SetupNetworkRequest
}

// Close closes the tap descriptors Setup opened. Call it once QEMU has
// started (it holds its own copies) or when the boot failed. The links
// themselves are released through the state release path.
func (e *Endpoint) Close() error {
	var errs []error
	for _, n := range e.NICs {
		if n.TapFile != nil {
			errs = append(errs, n.TapFile.Close())
		}
	}
	return errors.Join(errs...)
}

// Setup builds the pod's network endpoint in the namespace o.Netns. On
// error nothing it created is left (the records it made are forgotten).
func Setup(o Options) (_ *Endpoint, retErr error) {
	model, err := CheckModel(o.Model)
	if err != nil {
		return nil, err
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	ep := &Endpoint{Model: model, Request: &agentapi.SetupNetworkRequest{}}
	if model == ModelNone || o.Netns == "" {
		return ep, nil
	}
	if o.Recorder == nil {
		return nil, errors.New("setting up the network: no recorder")
	}
	h, err := openNetns(o.Netns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	scanned, err := scan(h)
	if err != nil {
		return nil, err
	}
	ep.Scanned = scanned

	var undo rollback.Stack
	defer func() {
		if retErr != nil {
			if err := errors.Join(ep.Close(), undo.Unwind()); err != nil {
				retErr = fmt.Errorf("%w (rolling back: %w)", retErr, err)
			}
		}
	}()
	// record records r, registers its release on undo, and returns it.
	record := func(r state.Resource) error {
		r.Netns = h.path
		if r.Data == nil {
			r.Data = map[string]string{}
		}
		r.Data[dataNetnsID] = h.id
		if err := o.Recorder.Record(r); err != nil {
			return fmt.Errorf("recording %s: %w", r, err)
		}
		undo.Add(r.String(), func() error {
			if err := Releasers()[r.Kind](context.Background(), r); err != nil {
				return err
			}
			return o.Recorder.Forget(r.Kind, r.Key)
		})
		return nil
	}

	for i, ifc := range scanned.Interfaces {
		var (
			f   *os.File
			mac = ifc.MAC
		)
		switch model {
		case ModelTCFilter:
			f, err = setupTCFilter(h, ifc, i, record)
		case ModelMacvtap:
			f, mac, err = setupMacvtap(h, ifc, i, record)
		}
		if f != nil {
			ep.NICs = append(ep.NICs, vm.NIC{ID: "net" + strconv.Itoa(i), MAC: mac, TapFile: f})
		}
		if err != nil {
			return nil, fmt.Errorf("connecting %s in %s to the VM (%s): %w", ifc.Name, h.path, model, err)
		}
		o.Log.Info("pod interface connected", "netns", h.path, "interface", ifc.Name, "model", model, "mac", mac.String())
	}
	ep.Request = BuildRequest(scanned, ep.NICs)
	undo.Release()
	return ep, nil
}

// keyOf is a resource key: unique per netns and link.
func keyOf(netns, link string, suffix ...string) string {
	k := netns + "#" + link
	for _, s := range suffix {
		k += "#" + s
	}
	return k
}
