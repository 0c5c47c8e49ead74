package podnet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// What the pods' CRI DNS configuration says, and what the test's DNS
// server in the harness's namespace answers.
const (
	dnsServerIP = "10.88.0.1" // the CNI bridge's (gateway) address
	dnsSearch   = "hull.test"
	dnsName     = "web.hull.test"
	dnsAnswer   = "192.0.2.80"
	// hullFilterPrio is internal/network's tc filter priority.
	hullFilterPrio = 0xc1a5
)

// netPod is a pod of the test with its web server container.
type netPod struct {
	handler string
	pod     *harness.Pod
	web     string // the httpd container
	ip      string
	netns   string   // the pod's network namespace path
	nsFile  *os.File // held open: inspected after containerd removed netns
}

func (p *netPod) networked() bool { return p.handler != handlerNone }

// nl is a netlink handle in the pod's namespace (through the held file,
// so it works after the path is gone).
func (p *netPod) nl(t *testing.T) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(netns.NsHandle(p.nsFile.Fd()))
	if err != nil {
		t.Fatalf("netlink in %s's namespace: %v", p.handler, err)
	}
	return h
}

// TestNetwork is issue 4's list on one containerd: a pod per model (runc
// beside them) each serving a page with busybox httpd, fetched from the
// test's namespace and from every other pod; names resolved through the
// CRI-given resolv.conf; each model's plumbing in the pod netns while it
// runs; strictcni proven strict on a runc pod; every pod stopped and
// removed without error, the namespace as CNI made it at DEL and nothing
// of Hull's left after; then bad input through ctr.
func TestNetwork(t *testing.T) {
	requireE2E(t)
	began := time.Now()
	e := newEnv(t)
	ctx := e.ctx(15 * time.Minute)
	dns, err := startDNS(e.ctd.NetnsPath, "0.0.0.0:53", dnsName, net.ParseIP(dnsAnswer))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dns.Close)
	t.Logf("containerd ready after %v", time.Since(began).Round(time.Millisecond))

	handlers := []string{harness.HandlerRunc, handlerTCFilter, handlerMacvtap, handlerNone}
	pods := make([]*netPod, len(handlers))
	errs := make([]error, len(handlers))
	var wg sync.WaitGroup
	for i, h := range handlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pods[i], errs[i] = e.startWebPod(ctx, h)
		}()
	}
	wg.Wait()
	for i, p := range pods {
		if p != nil {
			t.Cleanup(func() { e.removeAtCleanup(p) })
		}
		if errs[i] != nil {
			t.Fatalf("pod %s: %v", handlers[i], errs[i])
		}
	}
	t.Logf("4 pods serving after %v", time.Since(began).Round(time.Millisecond))
	var networked []*netPod
	for _, p := range pods {
		if p.networked() {
			networked = append(networked, p)
		}
	}

	t.Run("Plumbing", func(t *testing.T) {
		for _, p := range pods {
			t.Run(p.handler, func(t *testing.T) { e.checkPlumbing(t, ctx, p) })
		}
	})
	t.Run("PageFromTestNetns", func(t *testing.T) {
		client := harness.HTTPClientInNetns(e.ctd.NetnsPath, false, 10*time.Second)
		for _, p := range networked {
			url := "http://" + p.ip + "/"
			var got string
			deadline := time.Now().Add(30 * time.Second)
			for {
				got, err = fetch(ctx, client, url)
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if want := "page-from-" + p.handler; err != nil || strings.TrimSpace(got) != want {
				t.Errorf("GET %s (pod %s) from the test's netns = %q, %v; want %q", url, p.handler, got, err, want)
			}
		}
	})
	t.Run("PodToPod", func(t *testing.T) {
		for _, from := range networked {
			for _, to := range networked {
				if from == to {
					continue
				}
				// (no wget -T: it crashes Debian's static busybox 1.35)
				out, stderr, code, err := e.cri.Exec(ctx, from.web, 30*time.Second, "wget", "-qO-", "http://"+to.ip+"/")
				if want := "page-from-" + to.handler; err != nil || code != 0 || strings.TrimSpace(out) != want {
					t.Errorf("in pod %s, wget http://%s/ (pod %s) = %q (stderr %q, exit %d, %v); want %q",
						from.handler, to.ip, to.handler, out, stderr, code, err, want)
				}
			}
		}
	})
	t.Run("DNS", func(t *testing.T) {
		for _, p := range pods {
			out, _, _, err := e.cri.Exec(ctx, p.web, 30*time.Second, "cat", "/etc/resolv.conf")
			if err != nil || !strings.Contains(out, "nameserver "+dnsServerIP) || !strings.Contains(out, "search "+dnsSearch) {
				t.Errorf("pod %s: /etc/resolv.conf = %q, %v; want the CRI DNS config (nameserver %s, search %s)", p.handler, out, err, dnsServerIP, dnsSearch)
			}
			if !p.networked() {
				continue
			}
			// busybox nslookup asks the resolv.conf nameserver; "web"
			// resolves through its search domain.
			for _, name := range []string{dnsName, "web"} {
				out, stderr, code, err := e.cri.Exec(ctx, p.web, 30*time.Second, "nslookup", "-type=a", name)
				if err != nil || code != 0 || !strings.Contains(out, dnsAnswer) {
					t.Errorf("pod %s: nslookup %s = %q (stderr %q, exit %d, %v); want %s from the resolv.conf nameserver",
						p.handler, name, out, stderr, code, err, dnsAnswer)
				}
			}
		}
	})
	t.Run("PortForward", func(t *testing.T) { e.portForward(t, ctx, pods) })
	t.Run("StrictCNIIsStrict", func(t *testing.T) {
		// The negative control: on the runc pod, take eth0's address away
		// (as a runtime moving it into a VM would): StopPodSandbox must
		// fail in strictcni's DEL. Then give it back.
		e.strictFailsWithoutAddress(t, ctx, pods[0])
	})
	t.Run("Teardown", func(t *testing.T) {
		for _, p := range pods {
			t.Run(p.handler, func(t *testing.T) { e.teardown(t, p) })
		}
	})
	t.Run("BadInput", func(t *testing.T) {
		t.Run("NonexistentNetns", func(t *testing.T) { e.nonexistentNetns(t, ctx) })
		for _, kind := range []string{"bridge", "tuntap"} {
			t.Run("Unbridgeable/"+kind, func(t *testing.T) { e.unbridgeable(t, ctx, kind) })
		}
	})
	t.Logf("TestNetwork took %v", time.Since(began).Round(time.Millisecond))
}

// startWebPod runs a pod with handler and the CRI DNS configuration, and
// in it busybox httpd serving a page that names the handler.
func (e *env) startWebPod(ctx context.Context, handler string) (*netPod, error) {
	name := "web-" + handler
	logDir := e.logRoot + "/" + name
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	cfg := harness.PodConfig(name, logDir)
	cfg.DnsConfig = &runtime.DNSConfig{Servers: []string{dnsServerIP}, Searches: []string{dnsSearch}, Options: []string{"ndots:1"}}
	start := time.Now()
	pod, err := e.cri.RunPodConfig(ctx, cfg, handler)
	if err != nil {
		return nil, fmt.Errorf("RunPodSandbox: %w", err)
	}
	p := &netPod{handler: handler, pod: pod}
	if p.netns, err = e.cri.PodNetns(ctx, pod.ID); err != nil || p.netns == "" {
		return p, fmt.Errorf("pod netns %q: %v", p.netns, err)
	}
	if p.nsFile, err = os.Open(p.netns); err != nil {
		return p, err
	}
	if p.ip, err = e.cri.PodIP(ctx, pod.ID); err != nil {
		return p, err
	}
	p.web, err = e.cri.StartNew(ctx, pod, harness.Container{
		Name: "web", Env: map[string]string{"PAGE": "page-from-" + handler},
		Command: []string{"sh", "-c", `mkdir -p /www && echo "$PAGE" > /www/index.html && exec httpd -f -p 80 -h /www`},
	})
	if err != nil {
		return p, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := e.cri.WaitState(wctx, p.web, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
		return p, err
	}
	e.t.Logf("pod %s (%s, IP %s, netns %s) serving after %v", handler, pod.ID[:12], p.ip, p.netns, time.Since(start).Round(time.Millisecond))
	return p, nil
}

// removeAtCleanup removes a pod a failed test left (no-op after
// Teardown).
func (e *env) removeAtCleanup(p *netPod) {
	if p.nsFile != nil {
		defer p.nsFile.Close()
	}
	if err := e.cri.RemovePod(e.ctx(2*time.Minute), p.pod.ID); err != nil {
		e.t.Errorf("removing pod %s at cleanup: %v", p.handler, err)
		// containerd keeps the netns of a pod whose CNI DEL failed: do
		// not leave it on the host (ip netns del).
		if p.netns != "" {
			unix.Unmount(p.netns, unix.MNT_DETACH)
			os.Remove(p.netns)
		}
	}
}

// fetch GETs url and returns the body of a 200 response.
func fetch(ctx context.Context, c *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	return string(b), err
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
