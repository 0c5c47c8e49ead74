package qemu

import (
	"testing"

	"github.com/hull-runtime/hull/internal/vm/qemu/qmp"
)

func TestAgentPortEvent(t *testing.T) {
	ev := func(name, data string) qmp.Event { return qmp.Event{Name: name, Data: []byte(data)} }
	for _, tc := range []struct {
		ev         qmp.Event
		open, shut bool
	}{
		{ev("VSERPORT_CHANGE", `{"open": true, "id": "agentport"}`), true, false},
		{ev("VSERPORT_CHANGE", `{"open": false, "id": "agentport"}`), false, true},
		{ev("VSERPORT_CHANGE", `{"open": false, "id": "otherport"}`), false, false},
		{ev("RESUME", ``), false, false},
		{ev("VSERPORT_CHANGE", `not json`), false, false},
	} {
		if got := AgentPortEvent(true)(tc.ev); got != tc.open {
			t.Errorf("%s %s: opened %v, want %v", tc.ev.Name, tc.ev.Data, got, tc.open)
		}
		if got := AgentPortEvent(false)(tc.ev); got != tc.shut {
			t.Errorf("%s %s: closed %v, want %v", tc.ev.Name, tc.ev.Data, got, tc.shut)
		}
	}
}
