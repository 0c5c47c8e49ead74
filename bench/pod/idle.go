package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

var (
	idlePods  int
	idleBatch int
	idleWait  time.Duration
	// idleHandler is the -idle pods' runtime handlers, comma-separated:
	// pod i runs on the (i mod n)th, so that they are measured side by side.
	idleHandler string
)

// memory is one process's share of host memory, from smaps_rollup.
type memory struct{ pss, anon, rss int64 }

func (m *memory) add(o memory) { m.pss += o.pss; m.anon += o.anon; m.rss += o.rss }

// idle starts n hull pods (one sleeping container each), idleBatch at a
// time, waits, and prints each pod's PSS (QEMU + shim) and the CPU the
// idle pods use, then what is left of the host's memory: `make
// bench-density` (100 pods). It removes the pods.
func idle(ctx context.Context, ctd *harness.Containerd, cri *harness.CRI, logRoot string, n int, wait time.Duration) error {
	handlers := strings.Split(idleHandler, ",")
	handlerOf := func(i int) string { return handlers[i%len(handlers)] }
	availBefore := memAvailable()
	ids := make([]string, n)
	errs := make([]error, n)
	created := time.Now()
	sem := make(chan struct{}, max(idleBatch, 1))
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ids[i], errs[i] = idlePod(ctx, cri, logRoot, i, handlerOf(i))
		}()
	}
	wg.Wait()
	createTime := time.Since(created)
	defer func() {
		for _, id := range ids {
			if id != "" {
				cri.RemovePod(context.WithoutCancel(ctx), id)
			}
		}
	}()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	fmt.Printf("\n%d idle %s pods (%d at a time, all running after %v), measured %v after they all run (MiB)\n",
		n, idleHandler, idleBatch, createTime.Round(time.Second), wait)
	time.Sleep(wait)
	pids := make([][]int, n) // each pod's QEMU and shim
	fmt.Printf("%-4s %-14s %10s %10s %10s %10s %12s\n", "pod", "handler", "QEMU PSS", "QEMU anon", "QEMU RSS", "shim PSS", "QEMU+shim PSS")
	totals := make([]int64, n)
	var sum int64
	for i, id := range ids {
		var q, sh memory
		// QEMUProcesses lists every QEMU of the harness's shims: keep
		// the one named after this sandbox.
		for _, p := range ctd.QEMUProcesses(id) {
			if strings.Contains(p.Cmdline, id) {
				m, _ := smaps(p.Pid)
				q.add(m)
				pids[i] = append(pids[i], p.Pid)
			}
		}
		for _, p := range ctd.ShimProcesses("containerd-shim") {
			if strings.Contains(p.Cmdline, id) {
				m, _ := smaps(p.Pid)
				sh.add(m)
				pids[i] = append(pids[i], p.Pid)
			}
		}
		totals[i] = q.pss + sh.pss
		sum += q.pss + sh.pss
		if i < 10 || i == n-1 {
			fmt.Printf("%-4d %-14s %10s %10s %10s %10s %12s\n", i, handlerOf(i), mb(q.pss), mb(q.anon), mb(q.rss), mb(sh.pss), mb(q.pss+sh.pss))
		} else if i == 10 {
			fmt.Printf("...\n")
		}
	}
	cpu := idleCPUPerPod(pids, 30*time.Second)
	for k, h := range handlers {
		var pss []int64
		var c []float64
		for i := k; i < n; i += len(handlers) {
			pss, c = append(pss, totals[i]), append(c, cpu[i])
		}
		fmt.Printf("%s: QEMU+shim PSS per idle pod median %s MiB, p95 %s MiB; idle CPU (QEMU + shim, over 30 s) per pod median %.2f%%, p95 %.2f%% of a core (%d pods)\n",
			h, mb(harness.Percentile(pss, 50)), mb(harness.Percentile(pss, 95)), 100*harness.Percentile(c, 50), 100*harness.Percentile(c, 95), len(pss))
	}
	fmt.Printf("all %d pods: PSS %s MiB, idle CPU %.1f%% of a core\n", n, mb(sum), 100*sumF(cpu))
	availAfter := memAvailable()
	fmt.Printf("host MemAvailable: %s GiB before the pods, %s GiB with all %d running (%s MiB per pod)\n",
		gb(availBefore), gb(availAfter), n, mb((availBefore-availAfter)/int64(n)))
	return nil
}

// idleCPUPerPod is each pod's CPU use (its processes together) over
// window, in cores.
func idleCPUPerPod(pids [][]int, window time.Duration) []float64 {
	read := func() []time.Duration {
		out := make([]time.Duration, len(pids))
		for i, ps := range pids {
			for _, pid := range ps {
				d, _ := harness.CPUTime(pid)
				out[i] += d
			}
		}
		return out
	}
	t0, c0 := time.Now(), read()
	time.Sleep(window)
	c1, el := read(), time.Since(t0)
	out := make([]float64, len(pids))
	for i := range out {
		out[i] = (c1[i] - c0[i]).Seconds() / el.Seconds()
	}
	return out
}

// memAvailable is the host's MemAvailable, in bytes.
func memAvailable() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	return 0
}

func sumF(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t
}

func gb(b int64) string { return fmt.Sprintf("%.2f", float64(b)/(1<<30)) }

func idlePod(ctx context.Context, cri *harness.CRI, logRoot string, i int, handler string) (string, error) {
	name := fmt.Sprintf("bench-idle-%d", i)
	logDir := filepath.Join(logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", err
	}
	pod, err := cri.RunPod(ctx, name, handler, logDir)
	if err != nil {
		return "", fmt.Errorf("idle pod %d: RunPodSandbox: %w", i, err)
	}
	id, err := cri.StartNew(ctx, pod, harness.Container{Name: "c", Command: []string{"sleep", "2147483647"}})
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		_, err = cri.WaitState(wctx, id, runtime.ContainerState_CONTAINER_RUNNING)
		cancel()
	}
	if err != nil {
		return pod.ID, fmt.Errorf("idle pod %d: %w", i, err)
	}
	return pod.ID, nil
}

// smaps reads Pss, Anonymous and Rss of pid from /proc/PID/smaps_rollup.
func smaps(pid int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var kb int64
		fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
		switch k {
		case "Pss":
			m.pss = kb << 10
		case "Anonymous":
			m.anon = kb << 10
		case "Rss":
			m.rss = kb << 10
		}
	}
	return m, sc.Err()
}

func mb(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
