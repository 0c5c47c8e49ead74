package podnet

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/internal/portforward"
	"github.com/hull-runtime/hull/test/e2e/harness"
)

// portForward reaches every pod's web server through CRI PortForward
// (`kubectl port-forward`), whatever its network model: containerd dials
// 127.0.0.1:80 in the pod netns, which Hull steers into the VM with one
// sk_lookup program attached to the netns while the pod runs.
func (e *env) portForward(t *testing.T, ctx context.Context, pods []*netPod) {
	for _, p := range pods {
		want := "page-from-" + p.handler
		var got string
		var err error
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err = e.cri.PortForward(ctx, p.pod.ID, 80, "GET /index.html HTTP/1.0\r\n\r\n")
			if err == nil && strings.Contains(got, want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Second)
		}
		if err != nil || !strings.Contains(got, want) {
			t.Errorf("pod %s: GET / through port-forward = %q, %v; want a page with %q", p.handler, got, err, want)
		}
		wantProgs := 1
		if p.handler == harness.HandlerRunc {
			wantProgs = 0
		}
		if n, err := portforward.AttachedPrograms(int(p.nsFile.Fd())); err != nil || n != wantProgs {
			t.Errorf("pod %s: %d sk_lookup programs on its netns (%v), want %d", p.handler, n, err, wantProgs)
		}
	}
}

// noSteeringLeft checks, after teardown, that no sk_lookup program is
// attached to the pod's (held) netns: the steering ends with the shim.
func (e *env) noSteeringLeft(t *testing.T, p *netPod) {
	if n, err := portforward.AttachedPrograms(int(p.nsFile.Fd())); err != nil || n != 0 {
		t.Errorf("after teardown, %d sk_lookup programs on the pod's netns (%v), want 0", n, err)
	}
}
