package runtime_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestSpecValidate: the checks every backend's Create relies on; a bad
// field is InvalidArgument naming it.
func TestSpecValidate(t *testing.T) {
	ok := runtime.Spec{LeaseID: "l-1", Image: "berth/base", AgentToken: "t"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for _, img := range []string{"berth/base:latest", "localhost:5000/x/y:1", "sha256:" + strings.Repeat("a", 64), strings.Repeat("b", 12), "busybox@sha256:" + strings.Repeat("c", 64)} {
		s := ok
		s.Image = img
		if err := s.Validate(); err != nil {
			t.Errorf("image %q: %v", img, err)
		}
	}
	bad := map[string]func(*runtime.Spec){
		"lease_id":     func(s *runtime.Spec) { s.LeaseID = "a/b" },
		"lease_id ":    func(s *runtime.Spec) { s.LeaseID = "-a" },
		"lease_id  ":   func(s *runtime.Spec) { s.LeaseID = strings.Repeat("a", 200) },
		"image":        func(s *runtime.Spec) { s.Image = "berth/UPPER" },
		"image ":       func(s *runtime.Spec) { s.Image = "a b" },
		"agent_token":  func(s *runtime.Spec) { s.AgentToken = "a b" },
		"env":          func(s *runtime.Spec) { s.Env = map[string]string{"BERTH_AGENT_SUPERVISED": "1"} },
		"labels":       func(s *runtime.Spec) { s.Labels = map[string]string{"": "x"} },
		"memory_bytes": func(s *runtime.Spec) { s.Resources.MemoryBytes = 1 << 20 },
		"pids_limit":   func(s *runtime.Spec) { s.Resources.PidsLimit = -1 },
		"nano_cpus":    func(s *runtime.Spec) { s.Resources.NanoCPUs = -1 },
		"user":         func(s *runtime.Spec) { s.User = "a b" },
		"user ":        func(s *runtime.Spec) { s.User = "x;rm -rf" },
		"user  ":       func(s *runtime.Spec) { s.User = strings.Repeat("u", 66) },
	}
	for _, u := range []string{"sandbox", "1000", "1000:1000", "sandbox:staff", "svc$", "a.b-c_d"} {
		s := ok
		s.User = u
		if err := s.Validate(); err != nil {
			t.Errorf("user %q: %v", u, err)
		}
	}
	for field, mutate := range bad {
		s := ok
		mutate(&s)
		err := s.Validate()
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("%s: %v; want InvalidArgument naming %s", field, err, strings.TrimSpace(field))
		}
	}
}
