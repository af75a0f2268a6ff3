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

// TestDiskConfig checks the disk limit's defaults.
func TestDiskConfig(t *testing.T) {
	d := orchestrator.Defaults()
	if d.DefaultDiskBytes != 10<<30 || d.Disk.Interval != 15*time.Second || d.Disk.Grace != 30*time.Second {
		t.Fatalf("defaults: disk %d interval %s grace %s", d.DefaultDiskBytes, d.Disk.Interval, d.Disk.Grace)
	}
	// Loading from flags, environment and file: cmd/orchestrator/internal/config.
}

// TestDiskAPI checks the edge: resources.diskBytes in and out, the default,
// a negative value refused naming the field, and the disk metrics.
func TestDiskAPI(t *testing.T) {
	o := orchtest.Start(t, func(c *orchestrator.Config) {
		c.DefaultDiskBytes = 64 << 20
		c.Disk.Interval = 50 * time.Millisecond
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
