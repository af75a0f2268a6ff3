package runtime_test

import (
	"maps"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestSandboxLabels checks the label set every backend writes, the instance
// default, and that SetLabels reads the ids back.
func TestSandboxLabels(t *testing.T) {
	spec := runtime.Spec{LeaseID: "l1", ConversationID: "c1", Labels: map[string]string{"color": "blue", "dev.berth.lease": "spoof"}}
	got := runtime.SandboxLabels(spec, "inst-default")
	want := map[string]string{
		runtime.LabelManaged:                        "true",
		runtime.LabelLease:                          "l1",
		runtime.LabelConversation:                   "c1",
		runtime.LabelInstance:                       "inst-default",
		runtime.LabelUserPrefix + "color":           "blue",
		runtime.LabelUserPrefix + "dev.berth.lease": "spoof",
	}
	if !maps.Equal(got, want) {
		t.Fatalf("SandboxLabels = %v, want %v", got, want)
	}
	spec.InstanceID = "inst-spec"
	if got := runtime.SandboxLabels(spec, "inst-default")[runtime.LabelInstance]; got != "inst-spec" {
		t.Errorf("instance label = %q, want the spec's", got)
	}
	if got := runtime.SandboxLabels(runtime.Spec{LeaseID: "l"}, "")[runtime.LabelInstance]; got != "" {
		t.Errorf("instance label without any = %q", got)
	}
	if !runtime.Selector(map[string]string{runtime.LabelUserPrefix + "color": "blue"}).Matches(got) {
		t.Errorf("a user-label selector does not match the labels")
	}

	var sb runtime.Sandbox
	sb.SetLabels(runtime.SandboxLabels(spec, ""))
	if sb.LeaseID != "l1" || sb.ConversationID != "c1" || sb.InstanceID != "inst-spec" || sb.Labels[runtime.LabelUserPrefix+"color"] != "blue" {
		t.Errorf("SetLabels: %+v", sb)
	}
	sb.SetLabels(nil)
	if sb.LeaseID != "" || sb.ConversationID != "" || sb.InstanceID != "" || sb.Labels != nil {
		t.Errorf("SetLabels(nil): %+v", sb)
	}
}

// TestCheckManaged: only LabelManaged=true counts; anything else is
// NotFound naming the engine and the id.
func TestCheckManaged(t *testing.T) {
	if err := runtime.CheckManaged("docker", "c1", runtime.SandboxLabels(runtime.Spec{LeaseID: "l"}, "")); err != nil {
		t.Errorf("managed: %v", err)
	}
	for _, labels := range []map[string]string{nil, {}, {runtime.LabelManaged: "false"}, {runtime.LabelManaged: "True"}} {
		err := runtime.CheckManaged("docker", "c1", labels)
		if !errdefs.IsNotFound(err) || err.Error() != "not found: docker: container c1 is not managed by berth (no dev.berth.managed=true label)" {
			t.Errorf("labels %v: %v", labels, err)
		}
		if runtime.IsManaged(labels) {
			t.Errorf("IsManaged(%v) = true", labels)
		}
	}
}
