package agent

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// warmMessages builds ahead the coder tables protobuf builds on a
// message's first use, for every registered message (the agent API,
// ttrpc's frames, their well-known types). The agent calls it before it
// serves, so in a template it is done once, before the snapshot, and no
// clone repeats it on its first requests (docs/templates.md, "Restoring
// a clone"). It returns the full names of the messages it covered; a
// message it could not build is named in the error and the others are
// still built.
func warmMessages() ([]protoreflect.FullName, error) {
	var names []protoreflect.FullName
	var errs []error
	// Partial: a message with proto2 required fields (descriptorpb's,
	// if linked) is still built rather than refused for being empty.
	marshal, unmarshal := proto.MarshalOptions{AllowPartial: true}, proto.UnmarshalOptions{AllowPartial: true}
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		b, err := marshal.Marshal(mt.New().Interface())
		if err == nil {
			err = unmarshal.Unmarshal(b, mt.New().Interface())
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("message %s: %w", mt.Descriptor().FullName(), err))
			return true
		}
		names = append(names, mt.Descriptor().FullName())
		return true
	})
	return names, errors.Join(errs...)
}
