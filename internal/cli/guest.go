package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/hull-runtime/hull/internal/guestimage"
)

const guestUsage = `usage: hull guest build [--agent PATH] [--out DIR] [--work DIR] [--kernel-deb FILE] [--compression none|gzip]`

func guestCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, guestUsage)
		return 2
	}
	fs := flag.NewFlagSet("hull guest build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o guestimage.Options
	fs.StringVar(&o.AgentBinary, "agent", "/usr/local/libexec/hull/hull-agent", "static hull-agent binary to use as the guest's /init")
	fs.StringVar(&o.OutDir, "out", "/usr/share/hull", "where to write vmlinux, vmlinuz and hull-initrd.img")
	fs.StringVar(&o.WorkDir, "work", "/var/cache/hull", "where to keep the downloaded kernel package")
	fs.StringVar(&o.KernelDeb, "kernel-deb", "", "use this kernel .deb instead of downloading linux-image-amd64 with apt")
	fs.StringVar(&o.Compression, "compression", "none", "initramfs compression: none (boots fastest) or gzip (smallest)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	o.Log = stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := guestimage.Build(ctx, o); err != nil {
		fmt.Fprintf(stderr, "hull guest build: %v\n", err)
		return 1
	}
	return 0
}
