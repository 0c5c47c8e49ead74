package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/run"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func runCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hull run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o run.Options
	var env, params stringList
	var timings, configPath string
	fs.StringVar(&configPath, "config", "", "configuration file (default: $HULL_CONFIG, else /etc/hull/config.toml, else built-in defaults)")
	fs.StringVar(&o.Rootfs, "rootfs", "", "host directory to use as the command's root filesystem (required)")
	fs.IntVar(&o.CPUs, "cpus", 0, "number of vCPUs (default: hypervisor.qemu.default_vcpus)")
	fs.IntVar(&o.MemoryMiB, "memory", 0, "guest memory in MiB (default: hypervisor.qemu.default_memory)")
	fs.BoolVar(&o.Interactive, "i", false, "keep stdin open and send it to the command")
	fs.BoolVar(&o.TTY, "t", false, "give the command a terminal")
	fs.Var(&env, "e", "set an environment variable KEY=VALUE (repeatable)")
	fs.StringVar(&o.Cwd, "w", "", "working directory inside the rootfs (default /)")
	fs.StringVar(&o.Kernel, "kernel", "", "guest kernel (default: hypervisor.qemu.kernel)")
	fs.StringVar(&o.Initrd, "initrd", "", "guest initramfs (default: hypervisor.qemu.initrd)")
	fs.StringVar(&o.QEMU, "qemu", "", "QEMU binary (default: hypervisor.qemu.path)")
	fs.StringVar(&o.MachineType, "machine", "", "QEMU machine type: q35, pc or microvm (default: hypervisor.qemu.machine_type)")
	fs.Var(&params, "kernel-param", "extra guest kernel parameter (repeatable)")
	fs.StringVar(&o.RunDir, "run-dir", config.DefaultCommandRunDir, "parent of the VM's runtime directory (while it boots)")
	fs.BoolVar(&o.Debug, "debug", false, "log debug messages")
	fs.StringVar(&timings, "timings", "", "write the run's timings as JSON to this file")
	if err := fs.Parse(expandShortFlags(args)); err != nil {
		return run.ExitRunFailed
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	cfg, _, warnings, err := config.Load(configPath)
	for _, w := range warnings {
		fmt.Fprintf(stderr, "hull run: warning: %s\n", w)
	}
	if err != nil {
		fmt.Fprintf(stderr, "hull run: %v\n", err)
		return run.ExitRunFailed
	}
	applyConfig(&o, cfg, set)
	o.Args = fs.Args()
	o.Env = env
	o.KernelParams = append(append([]string(nil), cfg.Hypervisor.KernelParams...), params...)
	o.Debug = o.Debug || cfg.Debug() || os.Getenv("HULL_DEBUG") != ""

	log := newLogger(stderr, o.Debug)
	r := run.New(o, run.Stdio{In: stdin, Out: stdout, Err: stderr}, log)
	code, err := r.Run(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "hull run: %v\n", err)
	}
	if timings != "" {
		if b, jerr := json.Marshal(r.Timings); jerr == nil {
			_ = os.WriteFile(timings, b, 0o644)
		}
	}
	return code
}

// applyConfig fills the options no flag set from the configuration.
func applyConfig(o *run.Options, cfg *config.Config, set map[string]bool) {
	h := cfg.Hypervisor
	if !set["cpus"] {
		o.CPUs = h.DefaultVCPUs
	}
	if !set["memory"] {
		o.MemoryMiB = h.DefaultMemory
	}
	o.TCGCacheMiB = h.TCGCacheSize
	if !set["kernel"] {
		o.Kernel = h.Kernel
	}
	if !set["initrd"] {
		o.Initrd = h.Initrd
	}
	if !set["qemu"] {
		o.QEMU = h.Path
	}
	if !set["machine"] {
		o.MachineType = h.MachineType
		o.Firmware = h.Firmware
	}
}

// expandShortFlags turns the docker-style `-it` / `-ti` into `-i -t`; the
// flag package does not combine single-letter flags.
func expandShortFlags(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if a == "-it" || a == "-ti" {
			out = append(out, "-i", "-t")
			continue
		}
		out = append(out, a)
	}
	return out
}
