// Command churn is `make bench-churn`: issue 5's churn through CRI against
// a private containerd (the e2e harness's) — rounds of pods, each running
// one container, created a batch at a time, left idle, then all removed —
// and what it costs: pods per minute, pod start (RunPodSandbox until the
// container runs) and teardown (StopPodSandbox + RemovePodSandbox)
// latency, median and p95, the peak and idle CPU of all shims, and the RSS
// of a shim and of a QEMU per pod. Leaks after each round are reported and
// make it fail.
//
// Needs root and the prerequisites of test/e2e/cri; HULL_BIN (the shim is
// taken from its directory), HULL_TEST_KERNEL and HULL_TEST_INITRD are
// set by `make bench-churn`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

func main() {
	pods := flag.Int("pods", 50, "pods per round")
	batch := flag.Int("batch", 10, "pods created (and removed) at a time")
	rounds := flag.Int("rounds", 3, "rounds")
	memory := flag.Int("memory", 128, "guest memory of each pod, MiB")
	idle := flag.Duration("idle", 10*time.Second, "how long the idle CPU is measured, with every pod of the round running")
	flag.Parse()
	if err := run(*pods, *batch, *rounds, *memory, *idle); err != nil {
		fmt.Fprintln(os.Stderr, "bench churn:", err)
		os.Exit(1)
	}
}

func run(pods, batch, rounds, memory int, idle time.Duration) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root")
	}
	hull, kernel, initrd := os.Getenv("HULL_BIN"), os.Getenv("HULL_TEST_KERNEL"), os.Getenv("HULL_TEST_INITRD")
	if hull == "" || kernel == "" || initrd == "" {
		return fmt.Errorf("set HULL_BIN, HULL_TEST_KERNEL and HULL_TEST_INITRD (make bench-churn does)")
	}
	dir, err := os.MkdirTemp("", "hull-bench-churn-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "hull.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\ndefault_memory = %d\n", kernel, initrd, memory)), 0o644); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel()
	ctd, cri, err := harness.Launch(ctx, harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: filepath.Dir(hull), HullConfig: cfg}, harness.CRINamespace)
	if err != nil {
		return err
	}
	leaked := false
	defer func() {
		for _, err := range ctd.Close() {
			leaked = true
			fmt.Fprintln(os.Stderr, "bench churn: leak:", err)
		}
	}()
	defer cri.Close()
	defer func() {
		// Whatever a failed round left.
		if ids, _ := cri.RemoveAllPods(context.Background()); len(ids) > 0 {
			fmt.Fprintf(os.Stderr, "bench churn: removed %d pods and containers left by failures\n", len(ids))
		}
	}()

	start := time.Now()
	res := harness.Churn(ctx, ctd, cri, harness.ChurnOptions{
		Handler: harness.HandlerHull, Pods: pods, Batch: batch, Rounds: rounds,
		LogRoot: filepath.Join(dir, "logs"), EarlySettle: 5 * time.Second, Settle: 30 * time.Second, IdleWindow: idle,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) },
	})
	total := time.Since(start)

	fmt.Printf("\nchurn: %d rounds of %d hull pods (one container each), %d at a time, %d MiB guests, in %v\n",
		rounds, pods, batch, memory, total.Round(time.Second))
	fmt.Printf("%-6s %8s %9s %9s %9s %9s %9s %9s %9s %11s %8s %9s %9s %9s\n", "round", "pods", "pods/min",
		"start50", "start95", "tdown50", "tdown95", "peakCPU", "idleCPU", "idle QEMUs", "wakeup/s", "shimRSS", "qemuRSS", "failures")
	var all harness.ChurnRound
	failures, leaks := 0, 0
	for i, r := range res {
		printRound(fmt.Sprint(i), pods, r)
		all.Start = append(all.Start, r.Start...)
		all.Teardown = append(all.Teardown, r.Teardown...)
		all.ShimRSS = append(all.ShimRSS, r.ShimRSS...)
		all.QEMURSS = append(all.QEMURSS, r.QEMURSS...)
		all.Elapsed += r.Elapsed
		all.Create += r.Create
		all.Remove += r.Remove
		all.PeakCPU = max(all.PeakCPU, r.PeakCPU)
		all.IdleCPU = max(all.IdleCPU, r.IdleCPU)
		all.IdleQEMUCPU = max(all.IdleQEMUCPU, r.IdleQEMUCPU)
		all.IdleWakeups = max(all.IdleWakeups, r.IdleWakeups)
		failures += len(r.Failures)
		leaks += len(r.Leaks)
		fmt.Printf("%-6s 5 s after the round's last pod came up: shims %.2f%% of a core, %.2f wake-ups/s each\n", "", 100*r.EarlyIdleCPU, r.EarlyWakeups)
		for _, err := range r.Failures {
			fmt.Printf("round %d: failure: %v\n", i, err)
		}
		for _, err := range r.Leaks {
			fmt.Printf("round %d: leak: %v\n", i, err)
		}
	}
	all.Failures = make([]error, failures)
	printRound("all", pods*len(res), all)
	fmt.Printf("pods/min: pods created and removed per minute spent creating and removing (batch at a time); idle CPU: all shims (and their QEMUs) with every pod of the round running, 30 s after the last came up, over %v (1.00%% = 1%% of one core; the highest round for \"all\"); wakeup/s: one idle shim's threads put on a CPU per second; peak: highest 1 s sample\n", idle)
	switch {
	case failures > 0 || leaks > 0:
		return fmt.Errorf("%d failures, %d leaks", failures, leaks)
	case leaked:
		return fmt.Errorf("leaks at the end")
	}
	return nil
}

func printRound(name string, pods int, r harness.ChurnRound) {
	// Pods created and removed per minute of creating and removing (the
	// idle measurement between the two is left out).
	perMin := 0.0
	if busy := r.Create + r.Remove; busy > 0 {
		perMin = float64(len(r.Teardown)) / busy.Minutes()
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	fmt.Printf("%-6s %8d %9.1f %9s %9s %9s %9s %8.1f%% %8.2f%% %10.1f%% %8.2f %9s %9s %9d\n", name, pods, perMin,
		ms(harness.Percentile(r.Start, 50)), ms(harness.Percentile(r.Start, 95)),
		ms(harness.Percentile(r.Teardown, 50)), ms(harness.Percentile(r.Teardown, 95)),
		100*r.PeakCPU, 100*r.IdleCPU, 100*r.IdleQEMUCPU, r.IdleWakeups,
		mib(harness.Percentile(r.ShimRSS, 50)), mib(harness.Percentile(r.QEMURSS, 50)), len(r.Failures))
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
