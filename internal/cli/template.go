package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hull-runtime/hull/internal/template"
)

// templateRmWait bounds `hull template rm`'s wait for a build in progress.
const templateRmWait = time.Minute

// TemplateEntry is one template in `hull template ls --json`.
type TemplateEntry struct {
	Key         string    `json:"key"`
	Created     time.Time `json:"created"`
	MachineType string    `json:"machine_type"`
	VCPUs       int       `json:"vcpus"`
	MemoryMiB   int       `json:"memory_mib"`
	NICs        int       `json:"nics"`
	Kernel      string    `json:"kernel"`
	DiskBytes   int64     `json:"disk_bytes"`
	Stale       bool      `json:"stale"`
	Error       string    `json:"error,omitempty"`
}

func templateCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "usage: hull template ls [--root DIR] [--json] | hull template rm [--root DIR] KEY...|--all\n")
		return 2
	}
	fs := flag.NewFlagSet("hull template "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var rf stateRootFlags
	rf.register(fs)
	switch args[0] {
	case "ls":
		asJSON := fs.Bool("json", false, "print a JSON array")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(stderr, "hull template ls: unexpected argument %q\n", fs.Arg(0))
			return 2
		}
		return templateLs(rf, *asJSON, stdout, stderr)
	case "rm":
		all := fs.Bool("all", false, "remove every template")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		if *all == (fs.NArg() > 0) {
			fmt.Fprint(stderr, "hull template rm: name templates by key (or a unique prefix), or give --all\n")
			return 2
		}
		return templateRm(rf, fs.Args(), *all, stdout, stderr)
	}
	fmt.Fprintf(stderr, "hull template: unknown subcommand %q (ls, rm)\n", args[0])
	return 2
}

func templateStore(rf stateRootFlags, cmd string, stderr io.Writer) *template.Store {
	root, err := rf.resolve()
	if err != nil {
		fmt.Fprintf(stderr, "hull template %s: %v\n", cmd, err)
		return nil
	}
	return template.NewStore(root, nil)
}

func templateEntries(s *template.Store) ([]TemplateEntry, error) {
	list, err := s.List()
	out := make([]TemplateEntry, 0, len(list))
	for _, in := range list {
		e := TemplateEntry{
			Key: in.Key, Created: in.Meta.Created, MachineType: in.Meta.Shape.MachineType,
			VCPUs: in.Meta.Shape.VCPUs, MemoryMiB: in.Meta.Shape.MemoryMiB, NICs: in.Meta.Shape.NICs,
			Kernel: in.Meta.Shape.Kernel, DiskBytes: in.DiskBytes, Stale: in.Stale,
		}
		if in.Err != nil {
			e.Error = in.Err.Error()
		}
		out = append(out, e)
	}
	return out, err
}

func templateLs(rf stateRootFlags, asJSON bool, stdout, stderr io.Writer) int {
	s := templateStore(rf, "ls", stderr)
	if s == nil {
		return 1
	}
	entries, err := templateEntries(s)
	if err != nil {
		fmt.Fprintf(stderr, "hull template ls: %v\n", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(entries); err != nil {
			fmt.Fprintf(stderr, "hull template ls: %v\n", err)
			return 1
		}
		return 0
	}
	writeTemplates(stdout, entries)
	return 0
}

// writeTemplates prints entries as a table.
func writeTemplates(w io.Writer, entries []TemplateEntry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEMPLATE\tMACHINE\tVCPUS\tMEMORY\tNICS\tON DISK\tAGE\tSTATUS")
	now := time.Now()
	for _, e := range entries {
		status := "ready"
		switch {
		case e.Error != "":
			status = "unusable: " + e.Error
		case e.Stale:
			status = "stale (an input changed)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d MiB\t%d\t%.1f MiB\t%s\t%s\n", e.Key, orDash(e.MachineType), e.VCPUs,
			e.MemoryMiB, e.NICs, float64(e.DiskBytes)/(1<<20), age(now.Sub(e.Created)), status)
	}
	tw.Flush()
}

// printTemplates adds root's templates to `hull ps`, when there are any.
func printTemplates(w io.Writer, root string) {
	entries, err := templateEntries(template.NewStore(root, nil))
	if err != nil || len(entries) == 0 {
		return
	}
	fmt.Fprintln(w)
	writeTemplates(w, entries)
}

func templateRm(rf stateRootFlags, keys []string, all bool, stdout, stderr io.Writer) int {
	s := templateStore(rf, "rm", stderr)
	if s == nil {
		return 1
	}
	if all {
		list, err := s.List()
		if err != nil {
			fmt.Fprintf(stderr, "hull template rm: %v\n", err)
			return 1
		}
		keys = nil
		for _, in := range list {
			keys = append(keys, in.Key)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), templateRmWait)
	defer cancel()
	code := 0
	for _, k := range keys {
		full, err := s.Remove(ctx, k)
		if err != nil {
			fmt.Fprintf(stderr, "hull template rm: %v\n", err)
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "removed VM template %s\n", full)
	}
	return code
}
