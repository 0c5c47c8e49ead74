package agent

import (
	"encoding/json"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// warmCodecs builds ahead the state that protobuf and encoding/json
// build on a type's first use (protobuf's per-message coder tables,
// encoding/json's field cache), for every registered message (the agent
// API, ttrpc's frames, their well-known types) and the OCI spec. The
// agent calls it before it serves, so in a template it is done once,
// before the snapshot, and no clone repeats it on its first requests
// (docs/templates.md, "Restoring a clone"). It returns the full names
// of the messages it covered.
func warmCodecs() ([]protoreflect.FullName, error) {
	var names []protoreflect.FullName
	var err error
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		b, merr := proto.Marshal(mt.New().Interface())
		if merr == nil {
			merr = proto.Unmarshal(b, mt.New().Interface())
		}
		if merr != nil {
			err = fmt.Errorf("message %s: %w", mt.Descriptor().FullName(), merr)
			return false
		}
		names = append(names, mt.Descriptor().FullName())
		return true
	})
	if err != nil {
		return names, err
	}
	// Encoding a zero Spec builds the encoders of every type it can
	// reach, and with them the field cache that decoding shares.
	if _, err := json.Marshal(&specs.Spec{}); err != nil {
		return names, fmt.Errorf("oci spec: %w", err)
	}
	return names, nil
}
