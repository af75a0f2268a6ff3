package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/orchtest"
)

func runCLI(t *testing.T, s *orchtest.Server, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		switch k {
		case "BERTH_ADDR":
			return s.Base
		case "BERTH_OPERATOR_TOKEN":
			return orchtest.OperatorToken
		}
		return ""
	}}
	code := RunLease(context.Background(), args, env)
	return code, out.String(), errb.String()
}

func TestLeaseCommands(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-cli", "--label", "team=x", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	var acq struct {
		Lease struct{ ID, State string } `json:"lease"`
		Token string
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil || acq.Lease.ID == "" || acq.Token == "" || acq.Lease.State != "LEASE_STATE_READY" {
		t.Fatalf("acquire json %q: %v", out, err)
	}
	id := acq.Lease.ID

	code, out, _ = runCLI(t, s, "get", id)
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "READY") || !strings.HasPrefix(out, "ID") {
		t.Errorf("get table: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "--selector", "team=x")
	if code != 0 || !strings.Contains(out, id) {
		t.Errorf("list: %d %q", code, out)
	}
	code, out, _ = runCLI(t, s, "list", "--selector", "team=y")
	if code != 0 || strings.Contains(out, id) {
		t.Errorf("list other selector: %d %q", code, out)
	}
	if code, _, errs = runCLI(t, s, "renew", "--ttl", "20m", id); code != 0 {
		t.Errorf("renew: %d %s", code, errs)
	}
	code, out, _ = runCLI(t, s, "release", "-o", "json", id)
	if code != 0 || !strings.Contains(out, "LEASE_STATE_RELEASED") {
		t.Errorf("release: %d %q", code, out)
	}
	code, out, errs = runCLI(t, s, "get", "nonexistent")
	if code == 0 || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, "not") {
		t.Errorf("get nonexistent: code %d stdout %q stderr %q", code, out, errs)
	}
	code, _, errs = runCLI(t, s, "list", "--state", "bogus")
	if code == 0 || !strings.Contains(errs, "--state") {
		t.Errorf("bad state: %d %q", code, errs)
	}
	code, _, errs = runCLI(t, s, "frobnicate")
	if code != 2 || !strings.Contains(errs, "unknown command") {
		t.Errorf("unknown subcommand: %d %q", code, errs)
	}
}
