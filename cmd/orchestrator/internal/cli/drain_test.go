package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

// drainCLI runs `orchestrator ARGS...` against s with the token tok.
func drainCLI(s *orchtest.Server, tok string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		switch k {
		case "BERTH_ADDR":
			return s.Base
		case "BERTH_TOKEN":
			return tok
		}
		return ""
	}}
	code := Run(context.Background(), args, env)
	return code, out.String(), errb.String()
}

func TestDrainCommand(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-drain", "-o", "json")
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &acq) != nil {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"drain"}, "--mode is required"},
		{[]string{"drain", "--mode", "freeze"}, "--mode must be hibernate or release"},
		{[]string{"drain", "--mode", "release", "extra"}, "unknown command"},
	} {
		if code, _, errs := drainCLI(s, orchtest.OperatorToken, c.args...); code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d %q; want 2 with %q", c.args, code, errs, c.want)
		}
	}
	// A tenant's token is refused.
	if code, _, errs := drainCLI(s, orchtest.ClientAToken, "drain", "--mode", "release"); code != 1 || !strings.Contains(errs, "operator token (permission denied)") {
		t.Fatalf("tenant drain: exit %d %q; want 1, permission denied", code, errs)
	}
	code, out, errs = drainCLI(s, orchtest.OperatorToken, "drain", "--mode", "hibernate", "-o", "json")
	var res struct{ Drained []string }
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || len(res.Drained) != 1 || res.Drained[0] != acq.Lease.ID {
		t.Fatalf("drain --mode hibernate: exit %d %q %q", code, out, errs)
	}
	code, out, errs = runCLI(t, s, "get", acq.Lease.ID, "-o", "json")
	var l struct{ State, Paused string }
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.State != "LEASE_STATE_PAUSED" || l.Paused != "hibernate" {
		t.Fatalf("lease after drain: %d %s %s", code, out, errs)
	}
	if code, _, errs := runCLI(t, s, "acquire", "--conversation", "c-new"); code != 1 || !strings.Contains(errs, "draining") || !strings.Contains(errs, "(unavailable)") {
		t.Fatalf("acquire while draining: exit %d %q; want 1, unavailable, draining", code, errs)
	}
	// The table: a count line; the second drain finds the lease paused.
	if code, out, errs := drainCLI(s, orchtest.OperatorToken, "drain", "--mode", "hibernate"); code != 0 || !strings.Contains(out, "drained 1 leases (hibernate), 0 failed") {
		t.Fatalf("drain table: exit %d %q %q", code, out, errs)
	}
}
