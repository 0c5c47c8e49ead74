package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/hostcheck"
	"github.com/hull-runtime/hull/internal/vm/qemu"
)

// EnvReport is what `hull env --json` prints: one JSON object.
type EnvReport struct {
	Version    string               `json:"version"`
	Commit     string               `json:"commit"`
	Config     EnvConfig            `json:"config"`
	Hypervisor hostcheck.QEMUInfo   `json:"hypervisor"`
	Kernel     hostcheck.KernelInfo `json:"kernel"`
	Initrd     hostcheck.InitrdInfo `json:"initrd"`
	Host       EnvHost              `json:"host"`
	Containerd string               `json:"containerd"` // version, "" when not found
}

// EnvConfig says which configuration was used and what it holds.
type EnvConfig struct {
	Source   config.Source    `json:"source"`
	Warnings []config.Warning `json:"warnings"`
	Values   *config.Config   `json:"values"`
}

// EnvHost is the host's capabilities.
type EnvHost struct {
	KVM    bool               `json:"kvm"`
	Accel  string             `json:"accel"` // "kvm", or "tcg" when KVM is unusable
	Cgroup string             `json:"cgroup"`
	Checks []hostcheck.Result `json:"checks"`
}

// loadConfig loads the configuration named by --config (or the usual
// places) and prints its warnings.
func loadConfig(cmd, path string, stderr io.Writer) (*config.Config, config.Source, []config.Warning, bool) {
	cfg, src, warns, err := config.Load(path)
	for _, w := range warns {
		fmt.Fprintf(stderr, "%s: warning: %s\n", cmd, w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return nil, src, warns, false
	}
	return cfg, src, warns, true
}

func envCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hull env", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print one JSON object")
	cfgPath := fs.String("config", "", "configuration file (default: $HULL_CONFIG, else "+config.DefaultPath+")")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hull env: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, src, warns, ok := loadConfig("hull env", *cfgPath, stderr)
	if !ok {
		return 1
	}
	hc := hostcheck.Check(context.Background(), cfg)
	rep := EnvReport{
		Version:    Version,
		Commit:     Commit,
		Config:     EnvConfig{Source: src, Warnings: warns, Values: cfg},
		Hypervisor: hc.QEMU,
		Kernel:     hc.Kernel,
		Initrd:     hc.Initrd,
		Host:       EnvHost{KVM: hc.KVM, Accel: hc.Accel, Cgroup: hc.Cgroup, Checks: hc.Results},
		Containerd: hc.Containerd,
	}
	if rep.Config.Warnings == nil {
		rep.Config.Warnings = []config.Warning{}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "hull env: %v\n", err)
			return 1
		}
		return 0
	}
	writeEnv(stdout, &rep)
	return 0
}

func writeEnv(w io.Writer, r *EnvReport) {
	or := func(s, alt string) string {
		if s == "" {
			return alt
		}
		return s
	}
	fmt.Fprintf(w, "hull %s (commit %s)\n\n", r.Version, r.Commit)

	fmt.Fprintf(w, "config: %s\n", r.Config.Source)
	for _, wn := range r.Config.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", wn)
	}
	for _, line := range strings.Split(strings.TrimRight(r.Config.Values.TOML(), "\n"), "\n") {
		if line == "" {
			fmt.Fprintln(w)
			continue
		}
		fmt.Fprintf(w, "  %s\n", line)
	}

	fmt.Fprintf(w, "\nhypervisor: %s\n", or(r.Hypervisor.Path, "not found ("+or(r.Config.Values.Hypervisor.Path, qemu.HullBinary+" or "+qemu.DistroBinary)+")"))
	fmt.Fprintf(w, "  version: %s\n", or(r.Hypervisor.Version, "unknown"))

	fmt.Fprintf(w, "\nkernel: %s\n", r.Kernel.Path)
	if r.Kernel.Format != "" {
		fmt.Fprintf(w, "  format: %s, %d bytes\n", r.Kernel.Format, r.Kernel.Size)
		fmt.Fprintf(w, "  version: %s\n", or(r.Kernel.Banner, "unknown"))
	}
	fmt.Fprintf(w, "initrd: %s\n", r.Initrd.Path)
	if r.Initrd.Compression != "" {
		fmt.Fprintf(w, "  %d bytes, compression: %s\n", r.Initrd.Size, r.Initrd.Compression)
	}

	fmt.Fprintf(w, "\nhost:\n  accelerator: %s\n  cgroup: %s\n", r.Host.Accel, or(r.Host.Cgroup, "unknown"))
	for _, c := range r.Host.Checks {
		fmt.Fprintf(w, "  %-12s %-4s %s\n", c.Name+":", status(c), c.Detail)
	}
	fmt.Fprintf(w, "\ncontainerd: %s\n", or(r.Containerd, "not found"))
}

// status is PASS, FAIL (a required check failed) or WARN.
func status(r hostcheck.Result) string {
	switch {
	case r.OK:
		return "PASS"
	case r.Required:
		return "FAIL"
	default:
		return "WARN"
	}
}
