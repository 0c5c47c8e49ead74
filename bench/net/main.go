// Command net is `make bench-net`: TCP throughput and request latency
// between a pod and a peer in the test's network namespace (the e2e
// harness's private containerd, CNI bridge + host-local), for Hull's
// tcfilter and macvtap models and a runc pod in the same run, the
// handlers interleaved round by round so that drift on the machine hits
// them alike.
//
// Each pod runs busybox httpd. Measured from Go in the harness's netns:
//   - stream: GET of a CGI that writes -mib MiB from /dev/zero (no
//     filesystem on the path), a new connection per fetch: MiB/s;
//   - connect: TCP handshake to port 80 (the listen backlog answers; no
//     process of the pod runs): the network round trip;
//   - GET: a small static page over a new connection, as wget does.
//
// Needs root and the prerequisites of test/e2e/cri; HULL_BIN (the shim is
// taken from its directory), HULL_TEST_KERNEL and HULL_TEST_INITRD are
// set by `make bench-net`. It prints numbers; it is not a test.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

func main() {
	mib := flag.Int("mib", 10, "MiB per stream fetch")
	rounds := flag.Int("rounds", 5, "rounds (one stream fetch and -requests requests per handler each)")
	requests := flag.Int("requests", 40, "connects and small GETs per handler per round")
	handlers := flag.String("handlers", "runc,hull-tcfilter,hull-macvtap", "runtime handlers to compare")
	flag.Parse()
	if err := run(*mib, *rounds, *requests, strings.Split(*handlers, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "bench net:", err)
		os.Exit(1)
	}
}

type result struct {
	stream            []float64 // MiB/s
	connect, get      []time.Duration
	streamErr, getErr int
}

func run(mib, rounds, requests int, handlers []string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root")
	}
	hull, kernel, initrd := os.Getenv("HULL_BIN"), os.Getenv("HULL_TEST_KERNEL"), os.Getenv("HULL_TEST_INITRD")
	if hull == "" || kernel == "" || initrd == "" {
		return fmt.Errorf("set HULL_BIN, HULL_TEST_KERNEL and HULL_TEST_INITRD (make bench-net does)")
	}
	dir, err := os.MkdirTemp("", "hull-bench-net-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	configs := map[string]string{}
	for _, model := range []string{"tcfilter", "macvtap"} {
		f := filepath.Join(dir, model+".toml")
		s := fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n\n[runtime]\ninternetworking_model = %q\n", kernel, initrd, model)
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			return err
		}
		configs["hull-"+model] = f
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	ctd, cri, err := harness.Launch(ctx, harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: filepath.Dir(hull),
		HullConfig: configs["hull-tcfilter"], HullHandlers: configs}, harness.CRINamespace)
	if err != nil {
		return err
	}
	defer func() {
		for _, err := range ctd.Close() {
			fmt.Fprintln(os.Stderr, "bench net: leak:", err)
		}
	}()
	defer cri.Close()

	ips := map[string]string{}
	for _, h := range handlers {
		id, ip, err := startServer(ctx, cri, filepath.Join(dir, "pods"), h, mib)
		if id != "" {
			defer func() {
				rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer rcancel()
				if err := cri.RemovePod(rctx, id); err != nil {
					fmt.Fprintln(os.Stderr, "bench net:", err)
				}
			}()
		}
		if err != nil {
			return fmt.Errorf("pod %s: %w", h, err)
		}
		ips[h] = ip
		fmt.Printf("pod %-14s %s\n", h, ip)
	}

	fresh := harness.HTTPClientInNetns(ctd.NetnsPath, false, 2*time.Minute)
	res := map[string]*result{}
	for _, h := range handlers {
		res[h] = &result{}
		// Warm up: the page cache, httpd, TCG's translation cache.
		get(ctx, fresh, "http://"+ips[h]+"/cgi-bin/stream")
		get(ctx, fresh, "http://"+ips[h]+"/small")
	}
	for r := 0; r < rounds; r++ {
		for _, h := range handlers {
			rs := res[h]
			start := time.Now()
			n, err := get(ctx, fresh, "http://"+ips[h]+"/cgi-bin/stream")
			if err != nil || n != int64(mib)<<20 {
				rs.streamErr++
				fmt.Fprintf(os.Stderr, "bench net: %s stream: %d bytes, %v\n", h, n, err)
			} else {
				rs.stream = append(rs.stream, float64(n)/(1<<20)/time.Since(start).Seconds())
			}
			for i := 0; i < requests; i++ {
				start := time.Now()
				c, err := harness.DialInNetns(ctx, ctd.NetnsPath, ips[h]+":80")
				if err == nil {
					rs.connect = append(rs.connect, time.Since(start))
					c.Close()
				}
				start = time.Now()
				if _, err := get(ctx, fresh, "http://"+ips[h]+"/small"); err != nil {
					rs.getErr++
				} else {
					rs.get = append(rs.get, time.Since(start))
				}
			}
		}
	}

	fmt.Printf("\n%d rounds; stream %d MiB per fetch (%d fetches), %d connects and GETs per handler\n", rounds, mib, rounds, rounds*requests)
	fmt.Printf("%-14s %22s %24s %24s %s\n", "handler", "stream MiB/s med (min)", "TCP connect med / p95", "small GET med / p95", "errors")
	for _, h := range handlers {
		rs := res[h]
		fmt.Printf("%-14s %12.1f (%6.1f) %12v / %-9v %12v / %-9v %d\n", h,
			median(rs.stream), minOf(rs.stream),
			harness.Percentile(rs.connect, 50).Round(time.Microsecond), harness.Percentile(rs.connect, 95).Round(time.Microsecond),
			harness.Percentile(rs.get, 50).Round(time.Microsecond), harness.Percentile(rs.get, 95).Round(time.Microsecond),
			rs.streamErr+rs.getErr)
	}
	return nil
}

// startServer runs a pod with handler whose container serves /small and
// the CGI /cgi-bin/stream (mib MiB of zeros) with busybox httpd.
func startServer(ctx context.Context, cri *harness.CRI, logRoot, handler string, mib int) (id, ip string, err error) {
	logDir := filepath.Join(logRoot, handler)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", "", err
	}
	pod, err := cri.RunPodConfig(ctx, harness.PodConfig("bench-"+handler, logDir), handler)
	if err != nil {
		return "", "", err
	}
	script := fmt.Sprintf(`mkdir -p /www/cgi-bin && echo ok > /www/small &&
printf '#!/bin/sh\necho "Content-Type: application/octet-stream"\necho\nexec head -c %d /dev/zero\n' > /www/cgi-bin/stream &&
chmod 755 /www/cgi-bin/stream && exec httpd -f -p 80 -h /www`, mib<<20)
	ct, err := cri.StartNew(ctx, pod, harness.Container{Name: "web", Command: []string{"sh", "-c", script}})
	if err != nil {
		return pod.ID, "", err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := cri.WaitState(wctx, ct, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
		return pod.ID, "", err
	}
	ip, err = cri.PodIP(ctx, pod.ID)
	return pod.ID, ip, err
}

// get fetches url and returns the body's length.
func get(ctx context.Context, c *http.Client, url string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	var resp *http.Response
	for try := 0; ; try++ { // httpd may still be starting
		resp, err = c.Do(req)
		if err == nil || try == 50 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	return n, err
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func minOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Min(xs)
}
