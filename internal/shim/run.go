package shim

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"time"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/protobuf"
	shimapi "github.com/containerd/containerd/runtime/v2/shim"
	"github.com/containerd/fifo"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hull-runtime/hull/internal/cli"
	"github.com/hull-runtime/hull/internal/stacks"
)

// The shim's process, written here rather than taken from containerd's
// runtime/v2/shim.RunManager (docs/shim.md, "The process"): that one
// forces a garbage collection and returns all free memory to the kernel
// every 30 s in every shim, which is most of what an idle pod's shim
// costs (50 idle shims: ≈1% of a core). Hull's shim collects only when it
// allocates, as any Go program does. The rest is what containerd expects
// of a shim's command line, the same on 1.6, 1.7 and 2.x.

// ttrpcAddressEnv names containerd's ttrpc address in a shim's
// environment: where task events are published.
const ttrpcAddressEnv = "TTRPC_ADDRESS"

// gcPercent is the shim's GOGC, containerd's shim package's choice: a
// shim's heap is small, and collecting a little early keeps it so.
const gcPercent = 40

// flags is a shim command line, as containerd writes it:
// [-namespace NS] [-id ID] [-address A] [-publish-binary B] [-bundle P]
// [-socket S] [-debug] [-v] [-info] [ACTION], ACTION being start, delete or
// nothing (the long-lived server that `start` spawns).
type flags struct {
	namespace, id, address, bundle, socket string
	debug, version, info                   bool
	action                                 string
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("containerd-shim-hull-v2", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.namespace, "namespace", "", "")
	fs.StringVar(&f.id, "id", "", "")
	fs.StringVar(&f.address, "address", "", "")
	fs.StringVar(&f.bundle, "bundle", "", "")
	fs.StringVar(&f.socket, "socket", "", "")
	fs.String("publish-binary", "", "") // unused: events go over ttrpc
	fs.BoolVar(&f.debug, "debug", false, "")
	fs.BoolVar(&f.version, "v", false, "")
	fs.BoolVar(&f.info, "info", false, "")
	if err := fs.Parse(args); err != nil {
		return f, fmt.Errorf("command line %q: %w", args, err)
	}
	f.action = fs.Arg(0)
	if fs.NArg() > 1 {
		return f, fmt.Errorf("command line %q: one action expected, got %q", args, fs.Args())
	}
	return f, nil
}

// Run is the shim binary's main.
func Run() {
	f, err := parseFlags(os.Args[1:])
	if err != nil {
		exitWith(err)
	}
	// containerd 2.x's -info and 2.3+'s bootstrap protocol first.
	if f.info {
		runInfo()
	}
	if handled, err := bootstrapStart(f, os.Stdin, os.Stdout); handled {
		exitWith(err)
	}
	exitWith(run(f))
}

func exitWith(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %s\n", RuntimeName, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func run(f flags) error {
	if f.version {
		fmt.Printf("%s:\n  Version: %s\n  Go version: %s\n", RuntimeName, cli.Version, runtime.Version())
		return nil
	}
	if f.namespace == "" {
		return errors.New("-namespace is required")
	}
	debug.SetGCPercent(gcPercent)
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(2) // fewer idle Ps and stacks; the shim mostly waits
	}
	// A write to a closed pipe (containerd gone) is an error, not death.
	ignore(unix.SIGPIPE)
	ctx := namespaces.WithNamespace(context.Background(), f.namespace)
	switch f.action {
	case "start":
		address, err := manager{}.Start(ctx, f.id, shimapi.StartOpts{
			Address: f.address, TTRPCAddress: os.Getenv(ttrpcAddressEnv), Debug: f.debug,
		})
		if err != nil {
			return err
		}
		_, err = os.Stdout.WriteString(address)
		return err
	case "delete":
		return runDelete(ctx, f)
	case "":
		return serve(ctx, f)
	default:
		return fmt.Errorf("unknown action %q (want start, delete or none)", f.action)
	}
}

// ignore keeps sigs from ending the process without setting them to
// SIG_IGN, which QEMU would inherit.
func ignore(sigs ...os.Signal) {
	signal.Notify(make(chan os.Signal, 1), sigs...)
}

// runDelete is `shim delete`. containerd reads everything it writes to
// stderr as warnings ("warnings while cleaning up dead shim"), so it logs
// nothing below warning, -debug or not; and it runs to the end even when
// containerd, shutting down, signals it.
func runDelete(ctx context.Context, f flags) error {
	ignore(unix.SIGTERM, unix.SIGINT)
	log.L.Logger.SetLevel(logrus.WarnLevel)
	ss, err := manager{}.Stop(ctx, f.id)
	if err != nil {
		return err
	}
	data, err := proto.Marshal(&taskAPI.DeleteResponse{
		Pid:        uint32(ss.Pid),
		ExitStatus: uint32(ss.ExitStatus),
		ExitedAt:   protobuf.ToTimestamp(ss.ExitedAt),
	})
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(data)
	return err
}

// serve is the long-lived shim server of a pod, started by `start` in the
// first task's bundle with the listening socket as fd 3 (or -socket).
// It serves the task API until Shutdown, an idle exit, SIGTERM or
// SIGINT, then removes its socket and flushes its events.
func serve(ctx context.Context, f flags) error {
	if err := setLogger(ctx, f.debug); err != nil {
		return err
	}
	publisher, err := shimapi.NewPublisher(os.Getenv(ttrpcAddressEnv))
	if err != nil {
		return fmt.Errorf("connecting to containerd's events at %s=%q: %w", ttrpcAddressEnv, os.Getenv(ttrpcAddressEnv), err)
	}
	defer publisher.Close()
	ctx, sd := shutdown.WithShutdown(ctx)
	defer sd.Shutdown()
	svc, err := newService(ctx, publisher, sd)
	if err != nil {
		return err
	}
	server, err := ttrpc.NewServer(
		ttrpc.WithServerHandshaker(ttrpc.UnixSocketRequireSameUser()),
		ttrpc.WithUnaryServerInterceptor(edgeInterceptor),
	)
	if err != nil {
		return fmt.Errorf("creating the ttrpc server: %w", err)
	}
	taskAPI.RegisterTaskService(server, svc)
	l, err := listener(f.socket)
	if err != nil {
		return err
	}
	go func() {
		defer l.Close()
		if err := server.Serve(ctx, l); err != nil && !errors.Is(err, net.ErrClosed) {
			log.G(ctx).WithError(err).Fatal("ttrpc server failed")
		}
	}()

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGUSR1)
	for done := false; !done; {
		select {
		case s := <-sigs:
			if s == unix.SIGUSR1 {
				dumpStacks(ctx)
				continue
			}
			log.G(ctx).WithField("signal", s).Info("shim exiting on signal")
			sd.Shutdown()
		case <-sd.Done():
			done = true
		}
	}

	// A shim killed (by the OOM killer, say) cannot do this; `shim
	// delete` then does.
	if address, err := shimapi.ReadAddress("address"); err == nil {
		_ = shimapi.RemoveSocket(address)
	}
	select {
	case <-publisher.Done():
		return nil
	case <-time.After(5 * time.Second):
		return errors.New("events not flushed to containerd within 5s")
	}
}

// setLogger points the shim's logger at containerd: the "log" fifo in the
// bundle, which containerd copies into its own log, dup'ed onto stderr so
// that a panic lands there too.
func setLogger(ctx context.Context, debugLevel bool) error {
	l := log.G(ctx).Logger
	l.SetFormatter(&logrus.TextFormatter{TimestampFormat: log.RFC3339NanoFixed, FullTimestamp: true})
	if debugLevel {
		l.SetLevel(logrus.DebugLevel)
	}
	out, err := fifo.OpenFifoDup2(ctx, "log", unix.O_WRONLY, 0o700, int(os.Stderr.Fd()))
	if err != nil {
		return fmt.Errorf("opening the log fifo: %w", err)
	}
	l.SetOutput(out)
	return nil
}

// listener is the socket `start` made (fd 3), or path.
func listener(path string) (net.Listener, error) {
	if path != "" {
		return net.Listen("unix", path)
	}
	l, err := net.FileListener(os.NewFile(3, "socket"))
	if err != nil {
		return nil, fmt.Errorf("the listening socket on fd 3: %w", err)
	}
	return l, nil
}

func dumpStacks(ctx context.Context) {
	log.G(ctx).Infof("=== goroutine stack dump ===\n%s\n=== end of dump ===", stacks.All())
}
