package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	"github.com/berth-dev/berth/pkg/workspace"
)

// TestSameReportLocalAndLeased runs the task on the host and in a leased
// sandbox (an in-process agent behind a real orchestrator and proxy) and
// requires byte-identical reports.
func TestSameReportLocalAndLeased(t *testing.T) {
	ctx := context.Background()
	local, err := workspace.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	var a bytes.Buffer
	if err := runTask(ctx, local, &a); err != nil {
		t.Fatalf("local: %v\n%s", err, a.String())
	}

	s := orchtest.Start(t, nil)
	leased, err := workspace.NewLeased(ctx, workspace.LeasedConfig{
		OrchestratorAddr: s.Base, Token: orchtest.OperatorToken, ConversationID: "agentloop-test", TTL: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer leased.Close()
	var b bytes.Buffer
	if err := runTask(ctx, leased, &b); err != nil {
		t.Fatalf("leased: %v\n%s", err, b.String())
	}
	if a.String() != b.String() {
		t.Fatalf("reports differ:\nlocal:\n%s\nleased:\n%s", a.String(), b.String())
	}
	for _, want := range []string{"exit 0\nPASS", "exit 1\nFAIL: got 'hello, berth!'", "modified greet.sh", "untracked NOTES", "matches: true"} {
		if !strings.Contains(a.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, a.String())
		}
	}
}
