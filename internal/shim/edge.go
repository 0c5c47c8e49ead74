package shim

import (
	"context"

	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/ttrpc"
)

// edgeInterceptor is the task API's edge: every error a method returns
// becomes a ttrpc status here, once, with the code of the errdefs kind it
// wraps (errdefs.ErrNotFound → NotFound, ...). Inside, errors wrap with
// %w; an error that already is a status passes unchanged. serve installs
// it on the shim's ttrpc server.
func edgeInterceptor(ctx context.Context, um ttrpc.Unmarshaler, _ *ttrpc.UnaryServerInfo, m ttrpc.Method) (interface{}, error) {
	resp, err := m(ctx, um)
	if err != nil {
		return resp, errdefs.ToGRPC(err)
	}
	return resp, nil
}

// agentCtx bounds one agent call of a task API method: containerd's
// context may carry no deadline, and a guest that stopped answering
// must not hold the call (and containerd's lock on the task) forever.
func agentCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, rpcTimeout)
}
