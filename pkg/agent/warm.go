package agent

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// agentProtoPackage is the protobuf package of the agent's own services.
const agentProtoPackage protoreflect.FullName = "berth.agent.v1"

// warmProto builds what the protobuf runtime otherwise builds on the
// first Marshal or Unmarshal of each message type (its encoding tables)
// for every message of package pkg, and returns their full names. Serve
// runs it off the request path, so that the first call of each kind in a
// new sandbox does not pay for it: on a warm-pool claim that first call
// is the Configure the claim waits for. It costs about 1.5 ms of CPU once
// for the agent's 66 messages; docs/benchmarks.md has what it saves.
func warmProto(pkg protoreflect.FullName) []protoreflect.FullName {
	var names []protoreflect.FullName
	protoregistry.GlobalTypes.RangeMessages(func(mt protoreflect.MessageType) bool {
		d := mt.Descriptor()
		if d.ParentFile().Package() != pkg {
			return true
		}
		m := mt.New().Interface()
		if b, err := proto.Marshal(m); err == nil {
			_ = proto.Unmarshal(b, m)
		}
		names = append(names, d.FullName())
		return true
	})
	return names
}
