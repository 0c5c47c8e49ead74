package agent

import (
	"testing"

	"github.com/containerd/ttrpc"
	"google.golang.org/protobuf/reflect/protoreflect"

	agentapi "github.com/hull-runtime/hull/api/agent/v1"
)

// TestWarmCodecsCoversTheAgentsMessages: every message the host and the
// agent exchange (the agent API's, nested ones included, and ttrpc's
// request and response frames) is among those built ahead.
func TestWarmCodecsCoversTheAgentsMessages(t *testing.T) {
	names, err := warmCodecs()
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
	for _, m := range []any{&ttrpc.Request{}, &ttrpc.Response{}} {
		want = append(want, m.(interface {
			ProtoReflect() protoreflect.Message
		}).ProtoReflect().Descriptor().FullName())
	}
	for _, n := range want {
		if !warmed[n] {
			t.Errorf("message %s was not built ahead", n)
		}
	}
}
