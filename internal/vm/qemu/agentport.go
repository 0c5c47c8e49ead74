package qemu

import (
	"context"
	"encoding/json"

	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

// agentPortID is QEMU's device id of the agent's virtio-serial port.
const agentPortID = "agentport"

// AgentPortEvent matches QEMU's report (VSERPORT_CHANGE) that the guest
// opened (open) or closed (!open) its end of the agent port.
func AgentPortEvent(open bool) func(qmp.Event) bool {
	return func(ev qmp.Event) bool {
		if ev.Name != "VSERPORT_CHANGE" {
			return false
		}
		var d struct {
			ID   string `json:"id"`
			Open bool   `json:"open"`
		}
		return json.Unmarshal(ev.Data, &d) == nil && d.ID == agentPortID && d.Open == open
	}
}

// WatchAgentPort starts watching the guest open (open) or close (!open)
// its end of the agent port: seen is closed when it does (never without a
// QMP connection); stop ends the watch.
func (q *QEMU) WatchAgentPort(open bool) (seen <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	c := q.QMP()
	if c == nil {
		return ch, func() {}
	}
	w := c.Watch(AgentPortEvent(open))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		if _, err := w.Wait(ctx); err == nil {
			close(ch)
		}
	}()
	return ch, func() { w.Stop(); cancel() }
}
