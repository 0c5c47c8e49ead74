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
	def := config.Defaults().Hypervisor
	fs := flag.NewFlagSet("hull run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o run.Options
	var env, params stringList
	var timings string
	fs.StringVar(&o.Rootfs, "rootfs", "", "host directory to use as the command's root filesystem (required)")
	fs.IntVar(&o.CPUs, "cpus", def.DefaultVCPUs, "number of vCPUs")
	fs.IntVar(&o.MemoryMiB, "memory", def.DefaultMemory, "guest memory in MiB")
	fs.BoolVar(&o.Interactive, "i", false, "keep stdin open and send it to the command")
	fs.BoolVar(&o.TTY, "t", false, "give the command a terminal")
	fs.Var(&env, "e", "set an environment variable KEY=VALUE (repeatable)")
	fs.StringVar(&o.Cwd, "w", "", "working directory inside the rootfs (default /)")
	fs.StringVar(&o.Kernel, "kernel", def.Kernel, "guest kernel")
	fs.StringVar(&o.Initrd, "initrd", def.Initrd, "guest initramfs")
	fs.StringVar(&o.QEMU, "qemu", def.Path, "QEMU binary")
	fs.StringVar(&o.MachineType, "machine", def.MachineType, "QEMU machine type: q35, pc or microvm")
	fs.Var(&params, "kernel-param", "extra guest kernel parameter (repeatable)")
	fs.StringVar(&o.RunDir, "run-dir", config.DefaultRunDir, "parent of the VM's runtime directory")
	fs.BoolVar(&o.Debug, "debug", false, "log debug messages")
	fs.StringVar(&timings, "timings", "", "write the run's timings as JSON to this file")
	if err := fs.Parse(expandShortFlags(args)); err != nil {
		return run.ExitRunFailed
	}
	o.Args = fs.Args()
	o.Env = env
	o.KernelParams = params
	o.Debug = o.Debug || os.Getenv("HULL_DEBUG") != ""

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
