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

const guestUsage = `usage: hull guest build [--agent PATH] [--pause PATH] [--out DIR] [--kernel hull|debian] [--kernel-dir DIR] [--work DIR] [--kernel-deb FILE] [--compression none|gzip]`

func guestCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, guestUsage)
		return 2
	}
	fs := flag.NewFlagSet("hull guest build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o guestimage.Options
	fs.StringVar(&o.AgentBinary, "agent", "/usr/local/libexec/hull/hull-agent", "static hull-agent binary to use as the guest's /init")
	fs.StringVar(&o.PauseBinary, "pause", "", "static pause binary (guest/pause) run as the guest's sandbox container; without it the agent runs the sandbox image's command")
	fs.StringVar(&o.OutDir, "out", "/usr/share/hull", "where to write vmlinux, vmlinuz and hull-initrd.img")
	fs.StringVar(&o.WorkDir, "work", "/var/cache/hull", "where to keep the downloaded kernel package")
	kernel := fs.String("kernel", "", "hull: Hull's own kernel from --kernel-dir (the default when --kernel-dir is given); debian: Debian's kernel package and its modules")
	fs.StringVar(&o.KernelDir, "kernel-dir", "", "the directory hack/build-kernel.sh printed, holding Hull's built vmlinux and vmlinuz")
	fs.StringVar(&o.KernelDeb, "kernel-deb", "", "with --kernel debian: use this kernel .deb instead of downloading linux-image-amd64 with apt")
	fs.StringVar(&o.Compression, "compression", "none", "initramfs compression: none (boots fastest) or gzip (smallest)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if err := checkKernelChoice(*kernel, o); err != nil {
		fmt.Fprintf(stderr, "hull guest build: %v\n", err)
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

// checkKernelChoice validates --kernel against --kernel-dir and
// --kernel-deb: Hull's kernel needs the built directory (an installed hull
// has no kernel source to build from), Debian's must not get one.
func checkKernelChoice(kernel string, o guestimage.Options) error {
	switch kernel {
	case "":
		return nil
	case guestimage.KernelHull:
		if o.KernelDir == "" {
			return fmt.Errorf("--kernel hull needs --kernel-dir: the directory hack/build-kernel.sh prints (make guest does both)")
		}
	case guestimage.KernelDebian:
		if o.KernelDir != "" {
			return fmt.Errorf("--kernel debian with --kernel-dir %s: the directory is Hull's kernel", o.KernelDir)
		}
	default:
		return fmt.Errorf("--kernel %q: want hull or debian", kernel)
	}
	return nil
}
