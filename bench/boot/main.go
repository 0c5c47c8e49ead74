// Command boot is `make bench-boot`: it runs `hull run --rootfs ROOTFS -- true`
// repeatedly and prints the median and p95 of the whole run and its parts,
// for Hull's default configuration and, side by side in the same run,
// for QEMU's defaults (pc machine, SeaBIOS, compressed bzImage) and, when
// HULL_BENCH_DEBIAN_GUEST names a guest image built from Debian's kernel
// (make guest-debian), for that kernel in Hull's configuration. Two more
// comparisons for a change: HULL_BENCH_BASE_GUEST names the guest
// directory of another build (e.g. the previous kernel) and
// HULL_BENCH_BASE_HULL another hull binary (e.g. the previous commit's),
// run together as "base" (either alone: the other is this build's);
// HULL_BENCH_KERNEL_PARAMS adds kernel parameters (space-separated) to
// Hull's default, run as "+ params".
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

type timings struct {
	QEMUStart    time.Duration `json:"qemu_start"`
	AgentReady   time.Duration `json:"agent_ready"`
	GuestReady   time.Duration `json:"guest_ready"`
	ProcessStart time.Duration `json:"process_start"`
	Command      time.Duration `json:"command"`
	Teardown     time.Duration `json:"teardown"`
	Total        time.Duration `json:"total"`
}

type variant struct {
	name string
	hull string // the hull binary; "" for HULL_BIN
	args []string
}

func main() {
	runs := flag.Int("runs", 10, "runs per configuration")
	flag.Parse()
	hull, kernel, initrd, rootfs := os.Getenv("HULL_BIN"), os.Getenv("HULL_TEST_KERNEL"), os.Getenv("HULL_TEST_INITRD"), os.Getenv("HULL_TEST_ROOTFS")
	if hull == "" || kernel == "" || initrd == "" || rootfs == "" {
		fmt.Fprintln(os.Stderr, "bench-boot: set HULL_BIN, HULL_TEST_KERNEL, HULL_TEST_INITRD, HULL_TEST_ROOTFS (make bench-boot does)")
		os.Exit(2)
	}
	bzImage := filepath.Join(filepath.Dir(kernel), "vmlinuz")
	variants := []variant{
		{"hull default (q35, qboot, PVH vmlinux)", "", []string{"--kernel", kernel, "--initrd", initrd}},
		{"QEMU defaults (pc, SeaBIOS, bzImage)", "", []string{"--kernel", bzImage, "--initrd", initrd, "--machine", "pc"}},
	}
	if deb := os.Getenv("HULL_BENCH_DEBIAN_GUEST"); deb != "" {
		variants = append(variants, variant{"Debian kernel + modules (q35, qboot, PVH)", "",
			[]string{"--kernel", filepath.Join(deb, "vmlinux"), "--initrd", filepath.Join(deb, "hull-initrd.img")}})
	}
	baseGuest, baseHull := os.Getenv("HULL_BENCH_BASE_GUEST"), os.Getenv("HULL_BENCH_BASE_HULL")
	if baseGuest != "" || baseHull != "" {
		k, i := kernel, initrd
		if baseGuest != "" {
			k, i = filepath.Join(baseGuest, "vmlinux"), filepath.Join(baseGuest, "hull-initrd.img")
		}
		variants = append(variants, variant{"base", baseHull, []string{"--kernel", k, "--initrd", i}})
	}
	if params := strings.Fields(os.Getenv("HULL_BENCH_KERNEL_PARAMS")); len(params) > 0 {
		args := []string{"--kernel", kernel, "--initrd", initrd}
		for _, p := range params {
			args = append(args, "--kernel-param", p)
		}
		variants = append(variants, variant{"+ " + strings.Join(params, " "), "", args})
	}
	results, err := measure(hull, rootfs, variants, *runs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-boot: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("hull run -- true, %d runs per configuration (median / p95, milliseconds)\n\n", *runs)
	parts := []struct {
		name string
		get  func(timings) time.Duration
	}{
		{"QEMU start (exec to QMP ready)", func(t timings) time.Duration { return t.QEMUStart }},
		{"kernel to agent ready (guest clock)", func(t timings) time.Duration { return t.GuestReady }},
		{"QMP ready to agent answering", func(t timings) time.Duration { return t.AgentReady }},
		{"agent ready to process started", func(t timings) time.Duration { return t.ProcessStart }},
		{"command (true)", func(t timings) time.Duration { return t.Command }},
		{"teardown", func(t timings) time.Duration { return t.Teardown }},
		{"whole run", func(t timings) time.Duration { return t.Total }},
	}
	fmt.Printf("%-38s", "part")
	for _, v := range variants {
		fmt.Printf(" | %-40s", v.name)
	}
	fmt.Println()
	fmt.Println(strings.Repeat("-", 38+len(variants)*43))
	for _, p := range parts {
		fmt.Printf("%-38s", p.name)
		for v := range variants {
			var ds []time.Duration
			for _, t := range results[v] {
				ds = append(ds, p.get(t))
			}
			med, p95 := stats(ds)
			fmt.Printf(" | %-40s", fmt.Sprintf("%7.0f / %7.0f", ms(med), ms(p95)))
		}
		fmt.Println()
	}
}

func stats(ds []time.Duration) (median, p95 time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	n := len(ds)
	if n == 0 {
		return 0, 0
	}
	median = ds[n/2]
	if n%2 == 0 {
		median = (ds[n/2-1] + ds[n/2]) / 2
	}
	idx := (95*n + 99) / 100 // nearest-rank p95
	return median, ds[idx-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// measure runs each variant runs times, interleaved so drift on the
// machine hits all alike, each round starting one further so none is
// always first, and returns each variant's timings. Its temporary
// directory is removed however it returns.
func measure(hull, rootfs string, variants []variant, runs int) ([][]timings, error) {
	tmp, err := os.MkdirTemp("", "hull-bench-boot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	results := make([][]timings, len(variants))
	for i := 0; i < runs; i++ {
		for k := range variants {
			v := (i + k) % len(variants)
			vr := variants[v]
			out := filepath.Join(tmp, "t.json")
			args := append([]string{"run", "--timings", out, "--rootfs", rootfs}, vr.args...)
			args = append(args, "--", "true")
			bin := hull
			if vr.hull != "" {
				bin = vr.hull
			}
			cmd := exec.Command(bin, args...)
			cmd.Stderr = os.Stderr
			if err := cmd.Run(); err != nil {
				return nil, fmt.Errorf("%s run %d: %w", vr.name, i, err)
			}
			var t timings
			b, err := os.ReadFile(out)
			if err == nil {
				err = json.Unmarshal(b, &t)
			}
			if err != nil {
				return nil, fmt.Errorf("reading timings: %w", err)
			}
			results[v] = append(results[v], t)
		}
	}
	return results, nil
}
