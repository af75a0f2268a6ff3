package orchestrator_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

func TestDiskConfig(t *testing.T) {
	d := orchestrator.Defaults()
	if d.DefaultDiskBytes != 10<<30 || time.Duration(d.DiskInterval) != 15*time.Second || time.Duration(d.DiskGrace) != 30*time.Second {
		t.Fatalf("defaults: disk %d interval %s grace %s", d.DefaultDiskBytes, time.Duration(d.DiskInterval), time.Duration(d.DiskGrace))
	}
	load := func(args []string, env map[string]string) (orchestrator.Config, error) {
		return orchestrator.LoadConfig(append([]string{"--data-dir", t.TempDir()}, args...), func(k string) string { return env[k] })
	}
	cfg, err := load(nil, map[string]string{"BERTH_DEFAULT_DISK_BYTES": "0", "BERTH_DISK_INTERVAL": "2s", "BERTH_DISK_GRACE": "1m"})
	if err != nil || cfg.DefaultDiskBytes != 0 || time.Duration(cfg.DiskInterval) != 2*time.Second || time.Duration(cfg.DiskGrace) != time.Minute {
		t.Fatalf("env: %v disk %d interval %s grace %s", err, cfg.DefaultDiskBytes, time.Duration(cfg.DiskInterval), time.Duration(cfg.DiskGrace))
	}
	// Flags win; 0 is a value (no limit), not "unset".
	cfg, err = load([]string{"--default-disk-bytes", "0", "--disk-grace", "5s"}, map[string]string{"BERTH_DEFAULT_DISK_BYTES": "1073741824"})
	if err != nil || cfg.DefaultDiskBytes != 0 || time.Duration(cfg.DiskGrace) != 5*time.Second {
		t.Fatalf("flags: %v disk %d grace %s", err, cfg.DefaultDiskBytes, time.Duration(cfg.DiskGrace))
	}
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"negative":          {env: map[string]string{"BERTH_DEFAULT_DISK_BYTES": "-5"}},
		"below 1 MiB":       {args: []string{"--default-disk-bytes", "1000"}},
		"above the maximum": {env: map[string]string{"BERTH_DEFAULT_DISK_BYTES": "2000000000", "BERTH_MAX_DISK_BYTES": "1000000000"}},
		"zero interval":     {env: map[string]string{"BERTH_DISK_INTERVAL": "0s"}},
	} {
		if _, err := load(c.args, c.env); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestDiskAPI checks the edge: resources.diskBytes in and out, the default,
// a negative value refused naming the field, and the disk metrics.
func TestDiskAPI(t *testing.T) {
	o := orchtest.Start(t, func(c *orchestrator.Config) {
		c.DefaultDiskBytes = 64 << 20
		c.DiskInterval = orchestrator.Duration(50 * time.Millisecond)
	})
	post := func(body string) (int, string) {
		req, _ := http.NewRequest("POST", o.Base+"/v1/leases", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+orchtest.OperatorToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	code, b := post(`{"conversationId":"d1"}`)
	if code != 200 || !strings.Contains(b, `"diskBytes":"67108864"`) {
		t.Fatalf("default: %d %s", code, b)
	}
	code, b = post(`{"conversationId":"d2","resources":{"diskBytes":"33554432"}}`)
	if code != 200 || !strings.Contains(b, `"diskBytes":"33554432"`) {
		t.Fatalf("requested: %d %s", code, b)
	}
	code, b = post(`{"conversationId":"d3","resources":{"diskBytes":"-1"}}`)
	if code != 400 || !strings.Contains(b, "resources.disk_bytes") {
		t.Fatalf("negative: %d %s", code, b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(o.Base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		var m strings.Builder
		_, _ = io.Copy(&m, resp.Body)
		resp.Body.Close()
		if strings.Contains(m.String(), "berth_disk_limited_leases 2\n") && !strings.Contains(m.String(), "berth_disk_measurements_total 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n%s", m.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
