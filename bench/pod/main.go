// Command pod is `make bench`: through CRI against a private containerd
// (the e2e harness's), it measures pod start (RunPodSandbox until the
// pod's first container runs) and pod teardown (StopPodSandbox and
// RemovePodSandbox), median and p95, for the runtime handlers hull and
// runc side by side in the same run (interleaved, so drift on the machine
// hits both alike), and the RSS of each pod's shim and QEMU.
//
// With -idle N it then starts N hull pods, -idle-batch (10) at a time,
// leaves them idle for -idle-wait (30 s) and prints each pod's PSS (QEMU +
// shim, from /proc/PID/smaps_rollup), their idle CPU and the host memory
// left: `make bench-density` is 100 of them.
// Then it prints where each hull handler's pod start went, phase by
// phase, from containerd's log (phases.go); HULL_BENCH_KEEP_LOG=FILE
// keeps that log (with the shims' lines), and -phases FILE prints the
// phases of a kept one.
// HULL_BENCH_QEMU_TOML adds lines to the [hypervisor.qemu] section of the
// hull config (e.g. default_memory = 192, or path = a QEMU wrapper), to
// compare settings.
//
// Needs root and the prerequisites of test/e2e/cri; HULL_BIN (the shim is
// taken from its directory), HULL_TEST_KERNEL and HULL_TEST_INITRD are
// set by `make bench`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

type sample struct {
	start, teardown time.Duration
	runPod          time.Duration // RunPodSandbox alone; start - runPod is create + start
	shimRSS         int64
	qemuRSS         int64
}

func main() {
	pods := flag.Int("pods", 10, "pods per runtime handler")
	handlers := flag.String("handlers", "hull,hull-cold,runc", "runtime handlers to compare (hull restores VMs from a template, hull-cold boots them, hull-tbN is hull with tcg_cache_size = N, hull-base and hull-base-cold use the initrd in HULL_BENCH_BASE_INITRD or the kernel and initrd in the guest directory HULL_BENCH_BASE_GUEST, hull-variant and hull-variant-cold add HULL_BENCH_VARIANT_TOML to hull's [hypervisor.qemu])")
	flag.StringVar(&idleHandler, "idle-handler", harness.HandlerHull, "runtime handlers of the -idle pods, comma-separated (pods alternate between them)")
	flag.IntVar(&idlePods, "idle", 0, "then start this many hull pods and report their PSS after -idle-wait")
	flag.IntVar(&idleBatch, "idle-batch", 10, "how many of the -idle pods are started at a time")
	flag.DurationVar(&idleWait, "idle-wait", 30*time.Second, "how long the -idle pods stay idle before they are measured")
	keptLog := flag.String("phases", "", "only print where the pods' start went, from a containerd log kept by HULL_BENCH_KEEP_LOG")
	flag.Parse()
	if *keptLog != "" {
		if err := phasesOfFile(*keptLog); err != nil {
			fmt.Fprintln(os.Stderr, "bench pod:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*pods, strings.Split(*handlers, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "bench pod:", err)
		os.Exit(1)
	}
}

func run(n int, handlers []string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root")
	}
	hull, kernel, initrd := os.Getenv("HULL_BIN"), os.Getenv("HULL_TEST_KERNEL"), os.Getenv("HULL_TEST_INITRD")
	if hull == "" || kernel == "" || initrd == "" {
		return fmt.Errorf("set HULL_BIN, HULL_TEST_KERNEL and HULL_TEST_INITRD (make bench does)")
	}
	dir, err := os.MkdirTemp("", "hull-bench-pod-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// guest is hull's [hypervisor.qemu] with a guest kernel and initrd and
	// more lines.
	guest := func(kernel, initrd, lines string) string {
		return fmt.Sprintf("[hypervisor.qemu]\nkernel = %q\ninitrd = %q\n%s\n%s", kernel, initrd, os.Getenv("HULL_BENCH_QEMU_TOML"), lines)
	}
	section := func(initrd, lines string) string { return guest(kernel, initrd, lines) } // this build's kernel
	const cold = "\n[factory]\nenable_template = false\n"
	// Each handler's configuration; "" is the hull handler's.
	configs := map[string]string{
		"": section(initrd, ""),
		// booted rather than restored from a template
		"hull-cold": section(initrd, cold),
	}
	// hull-variant(-cold): hull with HULL_BENCH_VARIANT_TOML's lines.
	if v := os.Getenv("HULL_BENCH_VARIANT_TOML"); v != "" {
		configs["hull-variant"], configs["hull-variant-cold"] = section(initrd, v+"\n"), section(initrd, v+"\n"+cold)
	}
	// hull-base(-cold), side by side: the kernel and initrd of the guest
	// directory HULL_BENCH_BASE_GUEST (e.g. the kernel before a change),
	// else this build's; the initrd in HULL_BENCH_BASE_INITRD (e.g. the
	// agent before a change) in place of either.
	baseGuest, baseInitrd := os.Getenv("HULL_BENCH_BASE_GUEST"), os.Getenv("HULL_BENCH_BASE_INITRD")
	if baseGuest != "" || baseInitrd != "" {
		k, i := kernel, initrd
		if baseGuest != "" {
			k, i = filepath.Join(baseGuest, "vmlinux"), filepath.Join(baseGuest, "hull-initrd.img")
		}
		if baseInitrd != "" {
			i = baseInitrd
		}
		configs["hull-base"], configs["hull-base-cold"] = guest(k, i, ""), guest(k, i, cold)
	}
	// hull-tbN: hull with a TCG translation cache of N MiB.
	for _, h := range append(handlers, strings.Split(idleHandler, ",")...) {
		mib, ok := strings.CutPrefix(h, "hull-tb")
		if !ok {
			continue
		}
		if _, err := strconv.Atoi(mib); err != nil {
			return fmt.Errorf("handler %s: want hull-tbN, N the cache size in MiB", h)
		}
		configs[h] = section(initrd, "tcg_cache_size = "+mib+"\n")
	}
	cfg := filepath.Join(dir, "hull.toml")
	extra := map[string]string{}
	for h, toml := range configs {
		p := cfg
		if h != "" {
			p = filepath.Join(dir, h+".toml")
			extra[h] = p
		}
		if err := os.WriteFile(p, []byte(toml), 0o644); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	ctd, cri, err := harness.Launch(ctx, harness.Options{Dir: filepath.Join(dir, "ctd"), ShimDir: filepath.Dir(hull), HullConfig: cfg,
		HullHandlers: extra}, harness.CRINamespace)
	if err != nil {
		return err
	}
	defer func() {
		if keep := os.Getenv("HULL_BENCH_KEEP_LOG"); keep != "" {
			// containerd's log, the shims' lines included: where a pod's
			// time goes, phase by phase.
			if b, err := os.ReadFile(ctd.LogFile); err == nil {
				os.WriteFile(keep, b, 0o644)
			}
		}
		for _, err := range ctd.Close() {
			fmt.Fprintln(os.Stderr, "bench pod: leak:", err)
		}
	}()
	defer cri.Close()

	results := map[string][]sample{}
	failed := map[string]error{}
	for i := 0; i < n; i++ {
		// Each round starts one handler further: the pod started after
		// another handler's teardown measured ≈ 0.1 s slower than the
		// next, so a fixed order favoured all but the first handler.
		for k := range handlers {
			h := handlers[(i+k)%len(handlers)]
			if failed[h] != nil {
				continue
			}
			s, err := onePod(ctx, ctd, cri, filepath.Join(dir, "logs"), h, i)
			if err != nil {
				failed[h] = err
				fmt.Fprintf(os.Stderr, "bench pod: %s: %v\n", h, err)
				continue
			}
			results[h] = append(results[h], s)
			fmt.Fprintf(os.Stderr, "%-9s pod %2d: start %v (RunPodSandbox %v), teardown %v\n", h, i,
				s.start.Round(time.Millisecond), s.runPod.Round(time.Millisecond), s.teardown.Round(time.Millisecond))
		}
	}

	fmt.Printf("\npod start (RunPodSandbox -> container running) and teardown (StopPodSandbox + RemovePodSandbox), %d pods each\n", n)
	fmt.Printf("%-9s %10s %10s %10s %12s %12s %14s %14s\n", "", "start p50", "start p95", "RunPod p50", "teardown p50", "teardown p95", "shim RSS p50", "QEMU RSS p50")
	for _, h := range handlers {
		ss := results[h]
		if len(ss) == 0 {
			fmt.Printf("%-9s failed: %v\n", h, failed[h])
			continue
		}
		var st, td, rp []time.Duration
		var shim, qemu []int64
		for _, s := range ss {
			st, td, rp = append(st, s.start), append(td, s.teardown), append(rp, s.runPod)
			shim, qemu = append(shim, s.shimRSS), append(qemu, s.qemuRSS)
		}
		q := "-"
		if h != harness.HandlerRunc {
			q = mib(harness.Percentile(qemu, 50))
		}
		fmt.Printf("%-9s %10v %10v %10v %12v %12v %14s %14s\n", h,
			harness.Percentile(st, 50).Round(time.Millisecond), harness.Percentile(st, 95).Round(time.Millisecond), harness.Percentile(rp, 50).Round(time.Millisecond),
			harness.Percentile(td, 50).Round(time.Millisecond), harness.Percentile(td, 95).Round(time.Millisecond),
			mib(harness.Percentile(shim, 50)), q)
		if failed[h] != nil {
			fmt.Printf("%-9s (stopped after %d pods: %v)\n", "", len(ss), failed[h])
		}
	}
	if err := phasesOfFile(ctd.LogFile); err != nil {
		fmt.Fprintln(os.Stderr, "bench pod: phases:", err)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d handler(s) failed", len(failed))
	}
	if idlePods > 0 {
		return idle(ctx, ctd, cri, filepath.Join(dir, "logs"), idlePods, idleWait)
	}
	return nil
}

func onePod(ctx context.Context, ctd *harness.Containerd, cri *harness.CRI, logRoot, handler string, i int) (sample, error) {
	var s sample
	name := fmt.Sprintf("bench-%s-%d", handler, i)
	logDir := filepath.Join(logRoot, name)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return s, err
	}
	t0 := time.Now()
	pod, err := cri.RunPod(ctx, name, handler, logDir)
	if err != nil {
		return s, fmt.Errorf("RunPodSandbox: %w", err)
	}
	s.runPod = time.Since(t0)
	removed := false
	defer func() {
		if !removed {
			cri.RemovePod(context.WithoutCancel(ctx), pod.ID)
		}
	}()
	id, err := cri.StartNew(ctx, pod, harness.Container{Name: "c", Command: []string{"sleep", "2147483647"}})
	if err != nil {
		return s, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := cri.WaitState(wctx, id, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
		return s, err
	}
	s.start = time.Since(t0)

	for _, p := range ctd.ShimProcesses("containerd-shim") {
		if strings.Contains(p.Cmdline, pod.ID) {
			r, _ := harness.RSS(p.Pid)
			s.shimRSS += r
		}
	}
	for _, p := range ctd.QEMUProcesses(pod.ID) {
		r, _ := harness.RSS(p.Pid)
		s.qemuRSS += r
	}

	t1 := time.Now()
	removed = true
	if err := cri.RemovePod(ctx, pod.ID); err != nil {
		return s, err
	}
	s.teardown = time.Since(t1)
	if leaks := ctd.Residue(10*time.Second, []string{pod.ID, id}); len(leaks) > 0 {
		return s, fmt.Errorf("pod %s left %v", pod.ID, leaks)
	}
	return s, nil
}

// pick returns the p-th percentile (nearest rank) of xs.
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
