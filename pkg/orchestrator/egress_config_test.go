package orchestrator_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// TestNetworkCeilingConfig: the operator ceiling's settings are validated
// at start, naming the setting.
func TestNetworkCeilingConfig(t *testing.T) {
	base := func() orchestrator.Config {
		c := orchestrator.Defaults()
		c.DataDir = t.TempDir()
		return c
	}
	if err := base().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	ok := base()
	ok.MaxNetworkMode, ok.DefaultNetworkMode = "restricted", "restricted"
	ok.DefaultNetworkAllow = []string{"pypi.org"}
	ok.NetworkAllowCeiling = []string{"pypi.org", "*.pythonhosted.org:443"}
	ok.NetworkAlwaysDeny = []string{"10.0.0.0/8"}
	if err := ok.Validate(); err != nil {
		t.Errorf("a consistent ceiling: %v", err)
	}
	for want, mutate := range map[string]func(*orchestrator.Config){
		"max-network-mode":         func(c *orchestrator.Config) { c.MaxNetworkMode = "wide" },
		"network.mode":             func(c *orchestrator.Config) { c.DefaultNetworkMode = "open" }, // above the ceiling
		"network.allow[0]":         func(c *orchestrator.Config) { c.DefaultNetworkAllow = []string{"example.org"} },
		"network-always-deny[0]":   func(c *orchestrator.Config) { c.NetworkAlwaysDeny = []string{"10.0.0.0/33"} },
		"network-allow-ceiling[1]": func(c *orchestrator.Config) { c.NetworkAllowCeiling = []string{"pypi.org", "*"} },
		"needs max-network-mode":   func(c *orchestrator.Config) { c.MaxNetworkMode = "open"; c.DefaultNetworkMode = "open" },
		"egress auto or required":  func(c *orchestrator.Config) { c.Egress = "off" },
	} {
		c := ok
		c.DefaultNetworkAllow = append([]string(nil), ok.DefaultNetworkAllow...)
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate() = %v, want an error naming it", want, err)
		}
	}
}
