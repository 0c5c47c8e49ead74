package agent

import (
	"log/slog"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
)

// oomKilled reports whether the exited process r names is a container's
// init process whose cgroup saw an OOM kill (memory.events oom_kill, which
// counts the whole subtree): the shim then publishes TaskOOM before the
// exit, as runc's shim does, and CRI reports the reason OOMKilled. The
// cgroup stays until RemoveContainer, so it is read after the exit.
func (s *Service) oomKilled(r *agentapi.ProcessRequest) bool {
	if r.ExecId != "" || s.Containers == nil {
		return false
	}
	st, err := s.Containers.Stats(r.ContainerId)
	if err != nil {
		slog.Warn("reading the OOM kills of an exited container", "container", r.ContainerId, "error", err)
		return false
	}
	return st.OOMKills > 0
}
