package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// TestValidateHostMountsKubernetes: host mounts are refused at start on
// the kubernetes runtime (a Pod cannot mount a host path), allowed on
// Docker; persistent workspaces need no setting on either.
func TestValidateHostMountsKubernetes(t *testing.T) {
	c := orchestrator.Defaults()
	c.DataDir = t.TempDir()
	c.AllowHostMounts = "/srv/projects:rw"
	if err := c.Validate(); err != nil {
		t.Fatalf("docker with host mounts: %v", err)
	}
	c.Runtime = "kubernetes"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "allow host mounts") {
		t.Errorf("kubernetes with host mounts: Validate() = %v, want an error naming allow host mounts", err)
	}
	c.AllowHostMounts = ""
	if err := c.Validate(); err != nil {
		t.Errorf("kubernetes without host mounts: %v", err)
	}
}
