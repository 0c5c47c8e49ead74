// Package cli implements the `hull` command's subcommands.
package cli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
)

// Version is set at build time with -ldflags "-X ...cli.Version=...".
var (
	Version = "dev"
	Commit  = "unknown"
)

const usage = `usage: hull COMMAND [ARGS...]

commands:
  run          run a command in a throwaway VM: hull run --rootfs DIR [flags] -- CMD [ARGS...]
  guest build  build the guest image: Hull's kernel (--kernel-dir) or Debian's, and the initramfs
  env          show version, configuration, guest assets and host capabilities: hull env [--json] [--config PATH]
  check        check that this host can run Hull, with a fix for each failure: hull check [--config PATH]
  ps           list sandboxes with their shim, QEMU, phase, age and resources: hull ps [--root DIR] [--json]
  gc           release what sandboxes whose shim is gone left behind: hull gc [--root DIR] [--dry-run]
  template     list or remove VM templates: hull template ls [--root DIR] [--json] | rm [--root DIR] KEY...|--all
  collect      a markdown report for a bug report: env, config, sandboxes, gc, logs: hull collect [--root DIR]
  version      print the version
`

// Main runs the CLI and returns the process exit status.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stdin, stdout, stderr)
	case "guest":
		return guestCmd(args[1:], stdout, stderr)
	case "env":
		return envCmd(args[1:], stdout, stderr)
	case "check":
		return checkCmd(args[1:], stdout, stderr)
	case "ps":
		return psCmd(args[1:], stdout, stderr)
	case "gc":
		return gcCmd(args[1:], stdout, stderr)
	case "template":
		return templateCmd(args[1:], stdout, stderr)
	case "collect":
		return collectCmd(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintf(stdout, "hull %s (commit %s)\n", Version, Commit)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "hull: unknown command %q\n%s", args[0], usage)
		return 2
	}
}

// newLogger logs to w at warning level (the CLI prints its results
// itself; warnings are what a person must see), or debug level when
// asked (--debug or $HULL_DEBUG).
func newLogger(w io.Writer, debug bool) *slog.Logger {
	level := slog.LevelWarn
	if debug || os.Getenv("HULL_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: dropTime}))
}

// dropTime keeps the CLI's log lines short: they are read by a person, now.
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
