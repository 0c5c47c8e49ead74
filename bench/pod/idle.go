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
	idlePods int
	idleWait time.Duration
)

// memory is one process's share of host memory, from smaps_rollup.
type memory struct{ pss, anon, rss int64 }

func (m *memory) add(o memory) { m.pss += o.pss; m.anon += o.anon; m.rss += o.rss }

// idle starts n hull pods (one sleeping container each) together, waits,
// and prints the PSS of each pod's QEMU and shim; it removes the pods.
func idle(ctx context.Context, ctd *harness.Containerd, cri *harness.CRI, logRoot string, n int, wait time.Duration) error {
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = idlePod(ctx, cri, logRoot, i)
		}()
	}
	wg.Wait()
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
	fmt.Printf("\n%d idle hull pods, measured %v after they all run (MiB)\n", n, wait)
	time.Sleep(wait)
	fmt.Printf("%-4s %10s %10s %10s %10s %12s\n", "pod", "QEMU PSS", "QEMU anon", "QEMU RSS", "shim PSS", "QEMU+shim PSS")
	var totals []int64
	for i, id := range ids {
		var q, sh memory
		// QEMUProcesses lists every QEMU of the harness's shims: keep
		// the one named after this sandbox.
		for _, p := range ctd.QEMUProcesses(id) {
			if strings.Contains(p.Cmdline, id) {
				m, _ := smaps(p.Pid)
				q.add(m)
			}
		}
		for _, p := range ctd.ShimProcesses("containerd-shim") {
			if strings.Contains(p.Cmdline, id) {
				m, _ := smaps(p.Pid)
				sh.add(m)
			}
		}
		totals = append(totals, q.pss+sh.pss)
		fmt.Printf("%-4d %10s %10s %10s %10s %12s\n", i, mb(q.pss), mb(q.anon), mb(q.rss), mb(sh.pss), mb(q.pss+sh.pss))
	}
	fmt.Printf("median QEMU+shim PSS per idle pod: %s MiB\n", mb(pick(totals, 50)))
	return nil
}

func idlePod(ctx context.Context, cri *harness.CRI, logRoot string, i int) (string, error) {
	name := fmt.Sprintf("bench-idle-%d", i)
	logDir := filepath.Join(logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return "", err
	}
	pod, err := cri.RunPod(ctx, name, harness.HandlerHull, logDir)
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
