package cli

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hull-runtime/hull/internal/state"
)

// PsEntry is one sandbox in `hull ps --json` (which prints a JSON array).
type PsEntry struct {
	ID         string             `json:"id"`
	Namespace  string             `json:"namespace,omitempty"`
	ShimPid    int                `json:"shim_pid"`
	ShimAlive  bool               `json:"shim_alive"`
	QEMUPid    int                `json:"qemu_pid,omitempty"` // 0 when no QEMU is recorded (or not started yet)
	QEMUAlive  bool               `json:"qemu_alive"`
	Phase      string             `json:"phase"`
	Created    time.Time          `json:"created"`
	AgeSeconds float64            `json:"age_seconds"`
	Resources  map[state.Kind]int `json:"resources"` // count by kind
}

func psCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hull ps", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rf stateRootFlags
	rf.register(fs)
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hull ps: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	root, err := rf.resolve()
	if err != nil {
		fmt.Fprintf(stderr, "hull ps: %v\n", err)
		return 1
	}
	list, listErr := (&state.Store{Root: root}).List()
	now := time.Now()
	entries := make([]PsEntry, 0, len(list))
	for _, sb := range list {
		qpid, qstart := sb.QEMUPid()
		entries = append(entries, PsEntry{
			ID:         sb.ID,
			Namespace:  sb.Namespace,
			ShimPid:    sb.ShimPid,
			ShimAlive:  state.ProcessAlive(sb.ShimPid, sb.ShimStartTime),
			QEMUPid:    qpid,
			QEMUAlive:  state.ProcessAlive(qpid, qstart),
			Phase:      sb.Phase,
			Created:    sb.Created,
			AgeSeconds: now.Sub(sb.Created).Seconds(),
			Resources:  sb.CountByKind(),
		})
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(entries); err != nil {
			fmt.Fprintf(stderr, "hull ps: %v\n", err)
			return 1
		}
	} else {
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAMESPACE\tSHIM\tQEMU\tPHASE\tAGE\tRESOURCES")
		for _, e := range entries {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ID, orDash(e.Namespace),
				pidStatus(e.ShimPid, e.ShimAlive), pidStatus(e.QEMUPid, e.QEMUAlive), e.Phase,
				age(now.Sub(e.Created)), countString(e.Resources))
		}
		tw.Flush()
		printTemplates(stdout, root)
	}
	if listErr != nil {
		// Print what could be read, then say what could not.
		for _, line := range strings.Split(listErr.Error(), "\n") {
			fmt.Fprintf(stderr, "hull ps: %s\n", line)
		}
		return 1
	}
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// pidStatus is "1234 (alive)", "1234 (dead)", or "-" for no pid.
func pidStatus(pid int, alive bool) string {
	switch {
	case pid == 0:
		return "-"
	case alive:
		return fmt.Sprintf("%d (alive)", pid)
	default:
		return fmt.Sprintf("%d (dead)", pid)
	}
}

// age rounds a duration for a person: 42s, 3m12s, 5h3m, 2d4h.
func age(d time.Duration) string {
	switch d = max(d, 0); {
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 24*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
	}
}

// countString is "dir=1 mount=2 process=1", or "-".
func countString(n map[state.Kind]int) string {
	if len(n) == 0 {
		return "-"
	}
	var parts []string
	for k, c := range n {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
