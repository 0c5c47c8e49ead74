package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/guest/channel"
	"github.com/hull-runtime/hull/internal/guest/container"
	"github.com/hull-runtime/hull/internal/guest/initsys"
	"github.com/hull-runtime/hull/internal/guest/reaper"
)

// Main is the agent as PID 1. It returns only after a fatal error has been
// logged and power-off failed.
func Main() int {
	started := time.Duration(bootTimeNs())
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: logLevel()}))
	slog.SetDefault(log)
	defer func() {
		if r := recover(); r != nil {
			log.Error("agent panicked", "panic", r)
			initsys.PowerOff()
		}
	}()
	log.Info("agent started", "since_boot", started)
	// Modules load from the initramfs, before the switch, so that they
	// need no copying to the new root; /init, the agent, stays on the
	// initramfs, which the switch makes read-only, and the helper is
	// re-executed from it (/proc/self/exe, container.Config's default).
	if _, err := initsys.LoadModules(log, initsys.ModulesFile, initsys.FinitModule); err != nil {
		log.Error("loading modules", "err", err)
	}
	if err := initsys.SwitchRoot("/init", initsys.ModulesDir); err != nil {
		log.Error("switching to a tmpfs root", "err", err)
		initsys.PowerOff()
		return 1
	}
	log.Debug("on the tmpfs root", "since_boot", time.Duration(bootTimeNs()))
	err := run(log)
	log.Error("agent failed", "err", err)
	initsys.PowerOff()
	return 1
}

// agentFatalFailpoint, given to the agent as hull_failpoint=agent-fatal on
// the kernel command line (only a shim built for fault-injection tests
// puts it there), makes the agent fail as a fatal error would: the error
// is logged to the console, and the guest powers off.
const agentFatalFailpoint = "agent-fatal"

func run(log *slog.Logger) error {
	if os.Getenv("hull_failpoint") == agentFatalFailpoint {
		return fmt.Errorf("failpoint %s: injected failure", agentFatalFailpoint)
	}
	ignoreSignals()
	if err := initsys.Setup(log); err != nil {
		log.Error("base filesystem setup incomplete", "err", err)
	}
	log.Debug("base filesystems mounted", "since_boot", time.Duration(bootTimeNs()))
	rp := reaper.New()
	go rp.Run(context.Background())

	cmdline := initsys.ReadCmdline()
	var l net.Listener
	if _, err := os.Stat("/dev/vsock"); err == nil && cmdline["hull.channel"] == "vsock" {
		vl, err := channel.ListenVsock(channel.VsockPort)
		if err != nil {
			return err
		}
		l = vl
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dev, err := channel.WaitPort(ctx, "/sys/class/virtio-ports", "/dev", channel.PortName)
		cancel()
		if err != nil {
			return fmt.Errorf("finding agent channel: %w", err)
		}
		l = channel.ListenPort(dev)
	}
	ready := bootTimeNs()
	log.Info("agent channel ready", "addr", l.Addr().String(), "since_boot", time.Duration(ready))

	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(recoverPanics(log)))
	if err != nil {
		return fmt.Errorf("creating ttrpc server: %w", err)
	}
	containers := container.NewManager(container.Config{Reaper: rp, Log: log, PauseDir: container.DefaultPauseDir})
	if err := containers.Prepare(); err != nil {
		log.Warn("preparing for containers ahead (each container does it then)", "err", err)
	}
	warmStart := time.Now()
	if names, err := warmMessages(); err != nil {
		log.Warn("building message coders ahead (a message not built is built on its first use)", "built", len(names), "err", err)
	} else {
		log.Debug("message coders built ahead", "messages", len(names), "elapsed", time.Since(warmStart))
	}
	svc := &Service{
		Containers: containers,
		ReadyNs:    ready,
		PowerOff: func() {
			log.Info("shutting down")
			unix.Kill(-1, unix.SIGKILL)
			unix.Sync()
			initsys.UnmountAll()
			initsys.PowerOff()
		},
	}
	agentapi.RegisterAgentService(srv, svc)
	if err := srv.Serve(context.Background(), l); err != nil {
		return fmt.Errorf("serving ttrpc: %w", err)
	}
	return fmt.Errorf("ttrpc server stopped")
}

// logLevel is debug when the kernel command line says hull_debug=1 (the
// kernel hands undotted unknown parameters to init as environment
// variables, before /proc is mounted).
func logLevel() slog.Level {
	if os.Getenv("hull_debug") == "1" {
		return slog.LevelDebug
	}
	return slog.LevelInfo
}
