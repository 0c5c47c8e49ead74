package shim

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/runtime/v2/shim"

	"google.golang.org/protobuf/encoding/protowire"
)

// containerd 2.3+ writes `start`'s parameters on its stdin as a protobuf
// BootstrapParams (containerd/api runtime/bootstrap/v1/bootstrap.proto)
// beside the legacy flags and environment, and reads a BootstrapResult
// from stdout (a plain address, what containerd 1.x reads, is still
// accepted as a legacy answer). containerd 1.6 and 1.7 write the runtime's
// options (a protobuf Any) there instead, or nothing. The api module
// Hull builds against (the one of containerd 1.7) predates these messages:
// the few fields used are read and written here with protowire.

// bootstrapParams are the fields of BootstrapParams the shim uses.
type bootstrapParams struct {
	InstanceID   string // 1
	Namespace    string // 2
	LogLevel     int32  // 3; debug is -4, trace -8
	GRPCAddress  string // 6, containerd_grpc_address
	TTRPCAddress string // 5, containerd_ttrpc_address
	SocketDir    string // 9
}

func (p *bootstrapParams) setString(num protowire.Number, v string) {
	switch num {
	case 1:
		p.InstanceID = v
	case 2:
		p.Namespace = v
	case 5:
		p.TTRPCAddress = v
	case 6:
		p.GRPCAddress = v
	case 9:
		p.SocketDir = v
	}
}

// Debug reports whether containerd runs at debug level or below.
func (p *bootstrapParams) Debug() bool { return p.LogLevel < 0 }

// errNotBootstrap: stdin holds no bootstrap parameters for this shim (an
// older containerd: empty, or runtime options).
var errNotBootstrap = errors.New("no bootstrap parameters")

// parseBootstrapParams decodes b and accepts it only when it names the
// instance and namespace of the command line, as containerd's own shim
// package does (pkg/shim/compat.go of containerd/v2): a 1.x runtime-options
// Any also starts with two string fields, but not with these.
func parseBootstrapParams(b []byte, id, namespace string) (*bootstrapParams, error) {
	if len(b) == 0 {
		return nil, errNotBootstrap
	}
	var p bootstrapParams
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: %w", errNotBootstrap, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2 || num == 5 || num == 6 || num == 9):
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: field %d: %w", errNotBootstrap, num, protowire.ParseError(n))
			}
			p.setString(num, v)
			b = b[n:]
		case typ == protowire.VarintType && num == 3:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, fmt.Errorf("%w: field %d: %w", errNotBootstrap, num, protowire.ParseError(n))
			}
			p.LogLevel = int32(v)
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return nil, fmt.Errorf("%w: field %d: %w", errNotBootstrap, num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	if p.InstanceID != id || p.Namespace != namespace {
		return nil, fmt.Errorf("%w: parameters for %s/%s, not %s/%s", errNotBootstrap, p.Namespace, p.InstanceID, namespace, id)
	}
	return &p, nil
}

// shimProtocolVersion is the task API version the shim serves: v2 (the
// task service of containerd 1.x), over ttrpc.
const shimProtocolVersion = 2

// marshalBootstrapResult encodes BootstrapResult{version, address,
// protocol "ttrpc"}.
func marshalBootstrapResult(address string) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, shimProtocolVersion)
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, address)
	b = protowire.AppendTag(b, 3, protowire.BytesType)
	b = protowire.AppendString(b, "ttrpc")
	return b
}

// bootstrapStart serves `start` from containerd 2.3+: when f is a start
// action and stdin holds this instance's bootstrap parameters, it starts
// (or finds) the pod's shim server as the legacy path does and answers
// with a BootstrapResult. handled is false for every other invocation,
// which the legacy path (run) then serves; a start's stdin is consumed
// either way, and that path never reads it.
func bootstrapStart(f flags, stdin io.Reader, stdout io.Writer) (handled bool, err error) {
	if f.action != "start" {
		return false, nil
	}
	namespace, id := f.namespace, f.id
	in, err := io.ReadAll(io.LimitReader(stdin, 10<<20))
	if err != nil {
		return false, fmt.Errorf("reading bootstrap parameters from stdin: %w", err)
	}
	p, err := parseBootstrapParams(in, id, namespace)
	if errors.Is(err, errNotBootstrap) {
		return false, nil
	}
	if err != nil {
		return true, err
	}
	ctx := namespaces.WithNamespace(context.Background(), p.Namespace)
	address, err := manager{}.Start(ctx, p.InstanceID, shim.StartOpts{
		Address:      p.GRPCAddress,
		TTRPCAddress: p.TTRPCAddress,
		Debug:        p.Debug(),
	})
	if err != nil {
		return true, err
	}
	_, err = stdout.Write(marshalBootstrapResult(address))
	return true, err
}
