package shim

import (
	"context"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/typeurl/v2"

	agent "github.com/hull-runtime/hull/api/agent/v1"
	"github.com/hull-runtime/hull/internal/agentclient"
)

// Stats returns the container's guest cgroup v2 statistics as cgroup v2
// Metrics, the type CRI decodes.
func (s *service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	if _, err := s.getTask(r.ID); err != nil {
		return nil, err
	}
	c, err := s.agent()
	if err != nil {
		return nil, err
	}
	ctx, cancel := agentCtx(ctx)
	defer cancel()
	resp, err := c.StatsContainer(ctx, &agent.ContainerRequest{ContainerId: r.ID})
	if err != nil {
		return nil, agentclient.Err(err)
	}
	a, err := typeurl.MarshalAny(metrics(resp))
	if err != nil {
		return nil, err
	}
	return &taskAPI.StatsResponse{Stats: protobuf.FromAny(a)}, nil
}

// metrics maps the agent's statistics onto cgroup v2 Metrics. CRI
// computes the working set as usage - inactive_file.
func metrics(r *agent.StatsContainerResponse) *stats.Metrics {
	var inactive uint64
	if r.MemoryUsageBytes > r.MemoryWorkingSetBytes {
		inactive = r.MemoryUsageBytes - r.MemoryWorkingSetBytes
	}
	return &stats.Metrics{
		Pids: &stats.PidsStat{Current: r.PidsCurrent, Limit: r.PidsLimit},
		CPU: &stats.CPUStat{
			UsageUsec:  r.CpuUsageNs / 1000,
			UserUsec:   r.CpuUserNs / 1000,
			SystemUsec: r.CpuSystemNs / 1000,
		},
		Memory: &stats.MemoryStat{
			Usage:        r.MemoryUsageBytes,
			UsageLimit:   r.MemoryLimitBytes,
			InactiveFile: inactive,
		},
		MemoryEvents: &stats.MemoryEvents{OomKill: r.OomKills},
	}
}
