package agent

import (
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
)

// TestWarmMessagesCoversTheAgentsMessages: every message the host and the
// agent exchange (the agent API's, nested ones included, and ttrpc's
// request and response frames) is among those built ahead.
func TestWarmMessagesCoversTheAgentsMessages(t *testing.T) {
	names, err := warmMessages()
	if err != nil {
		t.Fatal(err)
	}
	warmed := make(map[protoreflect.FullName]bool, len(names))
	for _, n := range names {
		warmed[n] = true
	}
	var want []protoreflect.FullName
	var walk func(protoreflect.MessageDescriptors)
	walk = func(ms protoreflect.MessageDescriptors) {
		for i := 0; i < ms.Len(); i++ {
			if !ms.Get(i).IsMapEntry() {
				want = append(want, ms.Get(i).FullName())
			}
			walk(ms.Get(i).Messages())
		}
	}
	walk(agentapi.File_agent_v1_agent_proto.Messages())
	if len(want) < 10 {
		t.Fatalf("the agent API has %d messages; the walk is broken", len(want))
	}
	want = append(want, proto.MessageName(&ttrpc.Request{}), proto.MessageName(&ttrpc.Response{}))
	for _, n := range want {
		if !warmed[n] {
			t.Errorf("message %s was not built ahead", n)
		}
	}
}
