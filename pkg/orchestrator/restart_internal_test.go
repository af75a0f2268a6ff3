package orchestrator

import (
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/lease"
)

// TestRestartAndPauseConfig: the restart and pause knobs take their
// defaults and rules from pkg/lease (Validate refuses what lease.New
// would, naming the field), and a restart limit of 0 or less means no
// restarts (lease.Config's -1), not the lease default.
func TestRestartAndPauseConfig(t *testing.T) {
	c := Defaults()
	c.DataDir = t.TempDir()
	if c.Restart != lease.DefaultRestartConfig() || c.Pause != lease.DefaultPauseConfig() {
		t.Fatalf("defaults: restart %+v pause %+v", c.Restart, c.Pause)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for want, mutate := range map[string]func(*Config){
		"restart_window":      func(c *Config) { c.Restart.Window = -time.Second },
		"default_idle_policy": func(c *Config) { c.Pause.DefaultIdlePolicy = "nap" },
	} {
		bad := c
		mutate(&bad)
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	for limit, want := range map[int]int{0: -1, -1: -1, 1: 1, 3: 3} {
		if got := leaseRestart(lease.RestartConfig{Limit: limit}).Limit; got != want {
			t.Errorf("restart limit %d: lease limit %d, want %d", limit, got, want)
		}
	}
}
