package shim

import (
	eventstypes "github.com/containerd/containerd/api/events"

	agent "github.com/hull-runtime/hull/api/agent/v1"
)

// reportOOM publishes TaskOOM for a container whose cgroup in the guest
// saw an OOM kill, before its TaskExit (the event queue keeps the order),
// as runc's shim does: containerd's CRI then reports the reason
// OOMKilled. The agent reports it with the init process's exit.
func (s *service) reportOOM(t *task, p *proc, resp *agent.WaitProcessResponse) {
	if !resp.OomKilled || p.execID != "" {
		return
	}
	s.logger(t.id).Info("the container's cgroup in the guest saw an OOM kill")
	s.events.send(&eventstypes.TaskOOM{ContainerID: t.id})
}
