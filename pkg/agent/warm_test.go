package agent

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
)

func TestWarmProtoVisitsTheAgentsMessages(t *testing.T) {
	names := warmProto(agentProtoPackage)
	for _, want := range []protoreflect.FullName{"berth.agent.v1.ConfigureRequest", "berth.agent.v1.ExecRequest", "berth.agent.v1.ExecResponse"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s not warmed (warmed %d: %v)", want, len(names), names)
		}
	}
	for _, n := range names {
		if !strings.HasPrefix(string(n), string(agentProtoPackage)+".") {
			t.Errorf("warmed %s, outside %s", n, agentProtoPackage)
		}
	}
}
