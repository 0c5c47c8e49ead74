package cri

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// TestRuncPortForward proves the port-forward client against runc.
func TestRuncPortForward(t *testing.T) {
	requireBase(t)
	portForwardScenario(t, newEnv(t), harness.HandlerRunc)
}

// TestHullPortForward: an HTTP server in a Hull pod, reached through CRI
// PortForward as `kubectl port-forward` reaches it (issue 14), a small
// page and one larger than an agent call carries, and nothing of the pod
// left after.
func TestHullPortForward(t *testing.T) {
	requireHull(t)
	portForwardScenario(t, newEnv(t), harness.HandlerHull)
}

const bigPage = 300 << 10 // above agentclient's 256 KiB per call

func portForwardScenario(t *testing.T, e *env, handler string) {
	ctx := e.ctx(8 * time.Minute)
	pod := e.runPod("pf-"+handler, handler)
	startRunning(t, ctx, e.cri, pod, harness.Container{Name: "web", Command: []string{"sh", "-c",
		"mkdir -p /www && echo hull-pf-ok > /www/index.html && head -c 307200 /dev/zero | tr '\\0' x > /www/big && exec httpd -f -p 8080 -h /www"}})

	// The server may need a moment after the container started.
	var body string
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := e.cri.PortForward(ctx, pod.ID, 8080, "GET /index.html HTTP/1.0\r\n\r\n")
		if err == nil && strings.Contains(got, "hull-pf-ok") {
			body = got
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /index.html through port-forward: %q, %v", got, err)
		}
		time.Sleep(time.Second)
	}
	if !strings.HasPrefix(body, "HTTP/1.") {
		t.Errorf("response %q does not start with an HTTP status line", body)
	}

	got, err := e.cri.PortForward(ctx, pod.ID, 8080, "GET /big HTTP/1.0\r\n\r\n")
	if err != nil {
		t.Fatalf("GET /big through port-forward: %v", err)
	}
	if _, page, ok := strings.Cut(got, "\r\n\r\n"); !ok || len(page) != bigPage || strings.Trim(page, "x") != "" {
		t.Errorf("GET /big: %d bytes of page (response %d bytes), want %d x's", len(page), len(got), bigPage)
	}

	// Nothing listens on port 9: no data comes back (runc's containerd
	// reports the refused connection on the error channel; Hull's side
	// accepts first and closes when the guest refuses).
	if got, err := e.cri.PortForward(ctx, pod.ID, 9, "x"); got != "" {
		t.Errorf("port 9 (nothing listens): got %q, %v; want no data", got, err)
	} else {
		t.Logf("port 9 (nothing listens): %v", err)
	}
	// Two connections at once.
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			got, err := e.cri.PortForward(context.WithoutCancel(ctx), pod.ID, 8080, "GET /index.html HTTP/1.0\r\n\r\n")
			if err == nil && !strings.Contains(got, "hull-pf-ok") {
				err = errUnexpected(got)
			}
			errs <- err
		}()
	}
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Errorf("concurrent port-forward: %v", err)
		}
	}
}

type errUnexpected string

func (e errUnexpected) Error() string { return "unexpected response " + string(e) }
