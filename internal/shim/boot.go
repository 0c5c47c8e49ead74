package shim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/errdefs"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hull-runtime/hull/internal/cgroup"
	"github.com/hull-runtime/hull/internal/config"
	"github.com/hull-runtime/hull/internal/failpoint"
	"github.com/hull-runtime/hull/internal/network"
	"github.com/hull-runtime/hull/internal/sandbox"
	"github.com/hull-runtime/hull/internal/state"
)

// loadConfig loads the pod's configuration: containerd's ConfigPath
// runtime option names the file, else $HULL_CONFIG, else
// /etc/hull/config.toml, else the built-in defaults.
func (s *service) loadConfig(r *taskAPI.CreateTaskRequest, logger *log.Entry) (*config.Config, config.Source, error) {
	cfg, src, warnings, err := config.Load(configPath(r))
	if err != nil {
		return nil, src, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "hull configuration: %v", err)
	}
	for _, w := range warnings {
		logger.Warn(fmt.Sprint(w))
	}
	return cfg, src, nil
}

// bootSandbox boots the pod's VM with cfg. The VM's lifetime is not
// bound to ctx.
func (s *service) bootSandbox(ctx context.Context, cfg *config.Config, src config.Source, st *state.Handle, fps failpoint.Set, id, hostname, netns, cgroupsPath string, annotations map[string]string) (*sandbox.Sandbox, error) {
	logger := log.G(s.ctx).WithField("sandbox", id)
	h := cfg.Hypervisor
	lim := sandbox.Limits{DefaultVCPUs: h.DefaultVCPUs, DefaultMemoryMiB: h.DefaultMemory,
		MaxVCPUs: h.DefaultMaxVCPUs, MaxMemoryMiB: h.DefaultMaxMemory}
	if lim.MaxVCPUs <= 0 {
		lim.MaxVCPUs = runtime.NumCPU()
	}
	if lim.MaxMemoryMiB <= 0 {
		lim.MaxMemoryMiB = hostMemoryMiB()
	}
	vcpus, mem, err := sandbox.Size(annotations, lim)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "sandbox %s: %v", id, err)
	}
	if !cfg.Runtime.SandboxCgroupOnly {
		cgroupsPath = "" // QEMU stays in the shim's cgroup
	}
	if cgroupsPath != "" {
		if _, err := cgroup.Path(cgroupsPath); err != nil {
			return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "sandbox %s: %v", id, err)
		}
	}
	logger.WithField("config", src.String()).WithField("vcpus", vcpus).WithField("memory_mib", mem).Info("booting the pod's VM")
	// One log stack: containerd's logger, at containerd's level.
	slogger := slog.New(newLogHandler(logger, cfg.Debug()))
	// ctx bounds the boot only (QEMU's process is never bound to it): if
	// containerd goes away mid-create, the boot stops and rolls back
	// instead of finishing for nobody.
	sb, err := s.newSandbox(ctx, sandbox.Options{
		ID:          id,
		Config:      cfg,
		VCPUs:       vcpus,
		MemoryMiB:   mem,
		Hostname:    hostname,
		Netns:       netns,
		CgroupsPath: cgroupsPath,
		Log:         slogger,
		State:       st,
		Failpoints:  fps,
	})
	var ule *network.UnsupportedLinkError
	if errors.Is(err, network.ErrNetnsGone) || errors.As(err, &ule) || errors.Is(err, network.ErrInvalidModel) {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "booting the VM of sandbox %s: %v", id, err)
	}
	if err != nil {
		return nil, fmt.Errorf("booting the VM of sandbox %s: %w", id, err)
	}
	return sb, nil
}

// hostMemoryMiB is the host's physical memory (default_maxmemory 0), 0
// (no cap) when sysinfo fails.
func hostMemoryMiB() int {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
}

// specCgroupsPath is the spec's linux.cgroupsPath, "" when it has none.
func specCgroupsPath(spec *specs.Spec) string {
	if spec == nil || spec.Linux == nil {
		return ""
	}
	return spec.Linux.CgroupsPath
}

// specNetns is the path of the spec's network namespace (CNI's pod
// netns), "" when the spec has none or shares the host's.
func specNetns(spec *specs.Spec) string {
	if spec == nil || spec.Linux == nil {
		return ""
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			return ns.Path
		}
	}
	return ""
}

// configPath is the ConfigPath runtime option, "" when not given.
func configPath(r *taskAPI.CreateTaskRequest) string {
	if r.Options == nil || !strings.HasSuffix(r.Options.GetTypeUrl(), "runtimeoptions.v1.Options") {
		return ""
	}
	var o runtimeoptions.Options
	if err := proto.Unmarshal(r.Options.GetValue(), &o); err != nil {
		return ""
	}
	return o.ConfigPath
}

func joinErrs(errs []error) error { return errors.Join(errs...) }
