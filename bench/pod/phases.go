package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hull-runtime/hull/test/e2e/harness"
)

// Where each hull pod's start went, phase by phase, read from containerd's
// log (the shims' lines are in it): the tables of docs/performance.md.
// The bench starts its pods one at a time, so a shim's first line belongs
// to the RunPodSandbox in progress; the pod's sandbox id confirms it when
// RunPodSandbox returns.

// phase is one step of a pod's start, from the event before it.
type phase struct {
	name     string
	from, to string // event names
}

// phases lists the steps in order. A clone has "restored"; a cold boot
// goes from "qmp" to "ready" (the boot).
var phases = []phase{
	{"RunPodSandbox → the shim boots the VM (netns, CNI, shim start)", "run", "boot"},
	{"→ QMP ready (QEMU's start)", "boot", "qmp"},
	{"→ VM restored", "qmp", "restored"},
	{"→ sandbox VM ready (restored: first Ping, clock, network; cold: the boot)", "restored|qmp", "ready"},
	{"→ pause created", "ready", "pause"},
	{"→ RunPodSandbox returns", "pause", "runret"},
	{"→ StartContainer called", "runret", "sc"},
	{"StartContainer → container created", "sc", "app"},
	{"→ started, StartContainer returns", "app", "scret"},
	{"whole", "run", "scret"},
}

// podEvents are one pod's events by name.
type podEvents struct {
	name    string
	sandbox string
	at      map[string]time.Time
}

var (
	reField    = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S*)`)
	rePodName  = regexp.MustCompile(`PodSandboxMetadata\{Name:([^,]+),`)
	reQuotedID = regexp.MustCompile(`\\?"([0-9a-f]{64})\\?"`)
)

// logFields splits a logrus text line into its fields, quoted values
// unquoted.
func logFields(line string) map[string]string {
	f := map[string]string{}
	for _, m := range reField.FindAllStringSubmatch(line, -1) {
		v := m[2]
		if strings.HasPrefix(v, `"`) {
			v = strings.ReplaceAll(v[1:len(v)-1], `\"`, `"`)
		}
		if _, seen := f[m[1]]; !seen {
			f[m[1]] = v
		}
	}
	return f
}

// readPhases reads containerd's log and returns the pods' events in the
// order the pods started.
func readPhases(r io.Reader) ([]*podEvents, error) {
	var pods []*podEvents
	bySandbox := map[string]*podEvents{}
	byContainer := map[string]*podEvents{}
	var current *podEvents // the RunPodSandbox in progress
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		f := logFields(sc.Text())
		msg := f["msg"]
		t, err := time.Parse(time.RFC3339Nano, f["time"])
		if err != nil || msg == "" {
			continue
		}
		id := func() string {
			if m := reQuotedID.FindStringSubmatch(msg); m != nil {
				return m[1]
			}
			return ""
		}
		set := func(p *podEvents, ev string) {
			if p != nil && p.at != nil {
				if _, ok := p.at[ev]; !ok {
					p.at[ev] = t
				}
			}
		}
		switch {
		case strings.HasPrefix(msg, "RunPodSandbox for "):
			m := rePodName.FindStringSubmatch(msg)
			if m == nil {
				continue
			}
			if !strings.Contains(msg, " returns sandbox id ") {
				current = &podEvents{name: m[1], at: map[string]time.Time{"run": t}}
				pods = append(pods, current)
				continue
			}
			if current != nil && current.name == m[1] {
				if sid := id(); sid != "" && current.sandbox != "" && sid != current.sandbox {
					current.at = nil // lines of another pod were taken for it
				}
				set(current, "runret")
				current = nil
			}
		case msg == "booting the pod's VM" && current != nil && f["sandbox"] != "":
			current.sandbox = f["sandbox"]
			bySandbox[current.sandbox] = current
			set(current, "boot")
		case msg == "qmp ready":
			set(bySandbox[f["sandbox"]], "qmp")
		case msg == "vm restored":
			set(bySandbox[f["sandbox"]], "restored")
		case msg == "sandbox VM ready":
			set(bySandbox[f["sandbox"]], "ready")
		case msg == "container created":
			p := bySandbox[f["sandbox"]]
			if f["container"] == f["sandbox"] {
				set(p, "pause")
			} else {
				set(p, "app")
			}
		case strings.HasPrefix(msg, "CreateContainer within sandbox ") && strings.Contains(msg, " returns container id "):
			ids := reQuotedID.FindAllStringSubmatch(msg, -1)
			if len(ids) == 2 {
				byContainer[ids[1][1]] = bySandbox[ids[0][1]]
			}
		case strings.HasPrefix(msg, "StartContainer for "):
			p := byContainer[id()]
			if strings.HasSuffix(msg, " returns successfully") {
				set(p, "scret")
			} else if !strings.Contains(msg, " returns ") {
				set(p, "sc")
			}
		}
	}
	return pods, sc.Err()
}

// phasesOfFile prints the phase table of the containerd log at path.
func phasesOfFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	pods, err := readPhases(f)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	printPhases(os.Stdout, phaseTable(pods))
	return nil
}

// handlerOf is the handler of a bench pod named bench-HANDLER-I, and I.
func handlerOf(name string) (string, string) {
	rest, ok := strings.CutPrefix(name, "bench-")
	if !ok {
		return "", ""
	}
	i := strings.LastIndex(rest, "-")
	if i < 0 {
		return "", ""
	}
	return rest[:i], rest[i+1:]
}

// phaseTable is, per hull handler, each phase's durations over the pods
// that have both its events; a handler's pod 0 (which builds its
// template) and runc's pods are left out.
func phaseTable(pods []*podEvents) map[string]map[string][]time.Duration {
	out := map[string]map[string][]time.Duration{}
	for _, p := range pods {
		h, i := handlerOf(p.name)
		if h == "" || h == harness.HandlerRunc || i == "0" || p.at == nil {
			continue
		}
		if _, ok := p.at["scret"]; !ok {
			continue // not started: an idle pod or a failed one
		}
		for _, ph := range phases {
			to, ok := p.at[ph.to]
			if !ok {
				continue
			}
			for _, from := range strings.Split(ph.from, "|") {
				if t, ok := p.at[from]; ok {
					if out[h] == nil {
						out[h] = map[string][]time.Duration{}
					}
					out[h][ph.name] = append(out[h][ph.name], to.Sub(t))
					break
				}
			}
		}
	}
	return out
}

// printPhases prints the table: median and mean per phase, ms.
func printPhases(w io.Writer, table map[string]map[string][]time.Duration) {
	handlers := make([]string, 0, len(table))
	for h := range table {
		handlers = append(handlers, h)
	}
	slices.Sort(handlers)
	for _, h := range handlers {
		n := len(table[h]["whole"])
		fmt.Fprintf(w, "\nwhere %s's pod start went, from containerd's log (%d pods, the first left out; ms median (mean))\n", h, n)
		for _, ph := range phases {
			ds := table[h][ph.name]
			if len(ds) == 0 {
				continue
			}
			var sum time.Duration
			for _, d := range ds {
				sum += d
			}
			fmt.Fprintf(w, "  %-72s %6d (%d)\n", ph.name, harness.Percentile(ds, 50).Milliseconds(), (sum / time.Duration(len(ds))).Milliseconds())
		}
	}
}
