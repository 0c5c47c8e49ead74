package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ChurnOptions configure Churn.
type ChurnOptions struct {
	Handler string
	// Pods per round, created Batch at a time (a sliding window: at most
	// Batch creations or removals in flight), for Rounds rounds.
	Pods, Batch, Rounds int
	// LogRoot holds the pods' log directories.
	LogRoot string
	// The idle CPU of the shims is measured over IdleWindow twice once
	// every pod of the round runs: EarlySettle after the last pod came
	// up (Early* results: shims a few seconds old still settle), and
	// Settle after it (the idle figures).
	EarlySettle, Settle, IdleWindow time.Duration
	// Logf, if set, reports progress.
	Logf func(format string, args ...any)
}

// ChurnRound is what one round measured.
type ChurnRound struct {
	// Start: RunPodSandbox until the pod's container runs; Teardown:
	// StopPodSandbox + RemovePodSandbox. One per pod that got there.
	Start, Teardown []time.Duration
	// Failures of CRI calls; Leaks found after the round's pods were
	// removed.
	Failures, Leaks []error
	// IdleCPU is the CPU use of all the round's shims while every pod
	// ran idle, in cores (0.01 = 1% of one core), over IdleWindow;
	// IdleQEMUCPU the same for their QEMUs.
	IdleCPU, IdleQEMUCPU float64
	// PeakCPU is the highest CPU use of all shims over a 1 s sample
	// during the round, in cores.
	PeakCPU float64
	// EarlyIdleCPU and EarlyWakeups are IdleCPU and IdleWakeups
	// measured EarlySettle after the last pod came up.
	EarlyIdleCPU, EarlyWakeups float64
	// Shims is the number of shims running while idle; IdleWakeups the
	// wake-ups per second of one of them (all their threads, averaged
	// over the shims) while idle.
	Shims       int
	IdleWakeups float64
	// RSS of each pod's shim and QEMU, once the pods ran.
	ShimRSS, QEMURSS []int64
	// Create and Remove are the wall time of the round's creations and
	// removals; Elapsed the whole round's.
	Create, Remove, Elapsed time.Duration
}

// Churn creates opts.Pods pods of opts.Handler, each running one
// container, opts.Batch at a time, measures the shims' idle CPU while they
// all run, removes them all, checks that nothing of them is left, and does
// that opts.Rounds times. It stops early only when ctx ends.
// ShimIdlePeriod is the window over which idle shims' CPU is measured:
// containerd's shim package forces a garbage collection and returns memory
// to the OS every 30 s (debug.FreeOSMemory in runtime/v2/shim), and shims
// started together do it together, so a shorter window catches all of
// those collections or none and reports 0.4% or 1.6% for the same shims.
const ShimIdlePeriod = 30 * time.Second

func Churn(ctx context.Context, ctd *Containerd, cri *CRI, opts ChurnOptions) []ChurnRound {
	if opts.Batch < 1 {
		opts.Batch = 1
	}
	if opts.IdleWindow <= 0 {
		opts.IdleWindow = ShimIdlePeriod
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var rounds []ChurnRound
	for r := 0; r < opts.Rounds && ctx.Err() == nil; r++ {
		rounds = append(rounds, churnRound(ctx, ctd, cri, opts, r, logf))
		rd := rounds[len(rounds)-1]
		logf("round %d: %d pods in %v (create %v, remove %v), %d failures, %d leaks, idle CPU of %d shims %.3f%% of a core, %.2f wake-ups/s per shim (%v after the last pod came up; after %v: %.3f%%, %.2f/s)",
			r, opts.Pods, rd.Elapsed.Round(time.Second), rd.Create.Round(time.Second), rd.Remove.Round(time.Second),
			len(rd.Failures), len(rd.Leaks), rd.Shims, 100*rd.IdleCPU, rd.IdleWakeups, opts.Settle, opts.EarlySettle, 100*rd.EarlyIdleCPU, rd.EarlyWakeups)
	}
	return rounds
}

type churnPod struct {
	pod   *Pod
	ct    string
	netns string
}

func churnRound(ctx context.Context, ctd *Containerd, cri *CRI, opts ChurnOptions, round int, logf func(string, ...any)) ChurnRound {
	var res ChurnRound
	var mu sync.Mutex // guards res and pods while workers run
	var pods []churnPod
	fail := func(err error) {
		mu.Lock()
		res.Failures = append(res.Failures, err)
		mu.Unlock()
		logf("round %d: %v", round, err)
	}
	t0 := time.Now()
	stopPeak := samplePeak(ctd, &res.PeakCPU)

	// Creation, Batch at a time.
	parallel(opts.Pods, opts.Batch, func(i int) {
		name := fmt.Sprintf("churn-r%d-p%d", round, i)
		logDir := filepath.Join(opts.LogRoot, name)
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			fail(err)
			return
		}
		start := time.Now()
		pod, err := cri.RunPod(ctx, name, opts.Handler, logDir)
		if err != nil {
			fail(fmt.Errorf("RunPodSandbox %s: %w", name, err))
			return
		}
		cp := churnPod{pod: pod}
		cp.netns, _ = cri.PodNetns(ctx, pod.ID)
		defer func() {
			mu.Lock()
			pods = append(pods, cp)
			mu.Unlock()
		}()
		id, err := cri.StartNew(ctx, pod, Container{Name: "c", Command: []string{"sleep", "2147483647"}})
		cp.ct = id
		if err != nil {
			fail(fmt.Errorf("pod %s: %w", name, err))
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if _, err := cri.WaitState(wctx, id, runtime.ContainerState_CONTAINER_RUNNING); err != nil {
			fail(fmt.Errorf("pod %s: %w", name, err))
			return
		}
		d := time.Since(start)
		mu.Lock()
		res.Start = append(res.Start, d)
		mu.Unlock()
	})
	res.Create = time.Since(t0)

	// Every pod runs: footprint, then the shims' idle CPU.
	for _, p := range pods {
		if sp, ok := ctd.PodShim(p.pod.ID); ok {
			if r, err := RSS(sp.Pid); err == nil {
				res.ShimRSS = append(res.ShimRSS, r)
			}
		}
		if qp, ok := ctd.PodQEMU(p.pod.ID); ok {
			if r, err := RSS(qp.Pid); err == nil {
				res.QEMURSS = append(res.QEMURSS, r)
			}
		}
	}
	settled := time.Now()
	if opts.EarlySettle > 0 {
		sleepCtx(ctx, opts.EarlySettle)
		res.EarlyIdleCPU, _, res.EarlyWakeups, _ = idleCPU(ctd, opts.IdleWindow)
	}
	sleepCtx(ctx, opts.Settle-time.Since(settled))
	res.IdleCPU, res.IdleQEMUCPU, res.IdleWakeups, res.Shims = idleCPU(ctd, opts.IdleWindow)

	// Removal, Batch at a time.
	t1 := time.Now()
	parallel(len(pods), opts.Batch, func(i int) {
		start := time.Now()
		if err := cri.RemovePod(ctx, pods[i].pod.ID); err != nil {
			fail(err)
			return
		}
		d := time.Since(start)
		mu.Lock()
		res.Teardown = append(res.Teardown, d)
		mu.Unlock()
	})
	res.Remove = time.Since(t1)
	stopPeak()

	// Nothing of the round may be left; shims exit on Shutdown, QEMU
	// with its shim.
	var ids, extra []string
	for _, p := range pods {
		ids = append(ids, p.pod.ID)
		if p.ct != "" {
			ids = append(ids, p.ct)
		}
		extra = append(extra, p.netns)
	}
	res.Leaks = ctd.Residue(15*time.Second, ids, extra...)
	deadline := time.Now().Add(15 * time.Second)
	for len(ctd.ShimProcesses("containerd-shim-hull-v2")) > 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	for _, p := range ctd.ShimProcesses("containerd-shim-hull-v2") {
		res.Leaks = append(res.Leaks, fmt.Errorf("shim still running after the round: %d %s", p.Pid, p.Cmdline))
	}
	for _, p := range ctd.QEMUProcesses(ids...) {
		res.Leaks = append(res.Leaks, fmt.Errorf("QEMU still running after the round: %d %s", p.Pid, p.Cmdline))
	}
	res.Elapsed = time.Since(t0)
	return res
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// parallel runs f(0..n-1), at most width at a time.
func parallel(n, width int, f func(i int)) {
	sem := make(chan struct{}, width)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i)
		}()
	}
	wg.Wait()
}

// cpuByPid is the CPU time of each process.
func cpuByPid(pids []int) map[int]time.Duration {
	m := map[int]time.Duration{}
	for _, pid := range pids {
		if d, err := CPUTime(pid); err == nil {
			m[pid] = d
		}
	}
	return m
}

// used is the CPU time the processes of a used between the two samples;
// processes in only one sample count for what they used while in both
// (a new one from 0).
func used(a, b map[int]time.Duration) time.Duration {
	var total time.Duration
	for pid, d := range b {
		total += d - a[pid]
	}
	return total
}

func (c *Containerd) shimPids() []int {
	var pids []int
	for _, p := range c.ShimProcesses("containerd-shim-hull-v2") {
		pids = append(pids, p.Pid)
	}
	return pids
}

func (c *Containerd) qemuPids() []int {
	var pids []int
	for _, p := range c.QEMUProcesses() {
		pids = append(pids, p.Pid)
	}
	return pids
}

// idleCPU measures the CPU use (in cores) of all shims and of all their
// QEMUs over window, and the wake-ups per second of a shim.
func idleCPU(c *Containerd, window time.Duration) (shims, qemus, wakeups float64, n int) {
	sp, qp := c.shimPids(), c.qemuPids()
	runs := func() map[int]int64 {
		m := map[int]int64{}
		for _, pid := range sp {
			if r, err := Runs(pid); err == nil {
				m[pid] = r
			}
		}
		return m
	}
	r0 := runs()
	s0, q0 := cpuByPid(sp), cpuByPid(qp)
	t0 := time.Now()
	time.Sleep(window)
	s1, q1 := cpuByPid(sp), cpuByPid(qp)
	r1 := runs()
	el := time.Since(t0).Seconds()
	var woke int64
	m := 0
	for pid, r := range r1 {
		if p, ok := r0[pid]; ok {
			woke += r - p
			m++
		}
	}
	if m > 0 {
		wakeups = float64(woke) / float64(m) / el
	}
	return used(s0, s1).Seconds() / el, used(q0, q1).Seconds() / el, wakeups, len(s0)
}

// samplePeak samples the shims' CPU use every second until the returned
// function is called, keeping the highest in *peak (cores).
func samplePeak(c *Containerd, peak *float64) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		prev, pt := cpuByPid(c.shimPids()), time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			cur, ct := cpuByPid(c.shimPids()), time.Now()
			// Only processes seen in both samples: a new shim's CPU
			// before this interval is not this interval's.
			var d time.Duration
			for pid, v := range cur {
				if p, ok := prev[pid]; ok {
					d += v - p
				}
			}
			if u := d.Seconds() / ct.Sub(pt).Seconds(); u > *peak {
				*peak = u
			}
			prev, pt = cur, ct
		}
	}()
	return func() { close(done); <-finished }
}

// Percentile returns the p-th percentile (nearest rank) of xs, 0 for none.
func Percentile[T int64 | time.Duration | float64](xs []T, p int) T {
	if len(xs) == 0 {
		return 0
	}
	s := append([]T(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := (p*len(s) + 99) / 100
	if k < 1 {
		k = 1
	}
	return s[k-1]
}
