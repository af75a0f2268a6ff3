package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Help output never shows a token: the --token flag has no default value;
// the environment is read only after parsing.
func TestHelpNeverPrintsToken(t *testing.T) {
	const secret = "s3cret-token-never-printed"
	env := func(out, errb *bytes.Buffer) Env {
		return Env{Stdout: out, Stderr: errb, Getenv: func(k string) string {
			switch k {
			case "BERTH_TOKEN", "BERTH_OPERATOR_TOKEN":
				return secret
			case "BERTH_ADDR":
				return "http://127.0.0.1:1"
			}
			return ""
		}}
	}
	ctx := context.Background()
	var cmds []string
	for _, sub := range []string{"acquire", "get", "list", "renew", "release", "reap", "watch", "pause", "resume"} {
		cmds = append(cmds, "lease "+sub)
	}
	cmds = append(cmds, "exec", "shell", "cp", "git status", "git diff")
	for _, name := range cmds {
		var out, errb bytes.Buffer
		Run(ctx, append(strings.Fields(name), "-h"), env(&out, &errb))
		all := out.String() + errb.String()
		if strings.Contains(all, secret) {
			t.Errorf("%s -h prints the token:\n%s", name, all)
		}
		if !strings.Contains(all, "-token") {
			t.Errorf("%s -h does not document --token:\n%s", name, all)
		}
	}
}

// The token from the environment is still used when --token is absent.
func TestTokenFromEnvironment(t *testing.T) {
	s := orchtest.Start(t, nil)
	for _, key := range []string{"BERTH_TOKEN", "BERTH_OPERATOR_TOKEN"} {
		var out, errb bytes.Buffer
		code := Run(context.Background(), []string{"lease", "list"}, Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
			switch k {
			case "BERTH_ADDR":
				return s.Base
			case key:
				return orchtest.OperatorToken
			}
			return ""
		}})
		if code != 0 {
			t.Errorf("token from %s: exit %d: %s", key, code, errb.String())
		}
	}
}

// Text from callers is printed escaped: a reason carrying a terminal escape
// sequence does not colour the operator's terminal.
func TestOutputEscapesControlCharacters(t *testing.T) {
	var out bytes.Buffer
	printTable(&out, &orchv1.Lease{Id: "l1", ConversationId: "c\x1b]0;title\x07", Owner: "o\u202eevil", Image: "berth/base",
		Reason: "released \x1b[31mRED\x1b[0m\nsecond line", State: orchv1.LeaseState_LEASE_STATE_RELEASED})
	got := out.String()
	if strings.ContainsAny(got, "\x1b\x07\u202e") || strings.Count(got, "\n") != 2 {
		t.Fatalf("raw control characters in the table:\n%q", got)
	}
	for _, want := range []string{`released \x1b[31mRED\x1b[0m\nsecond line`, `c\x1b]0;title\a`, `o\u202eevil`} {
		if !strings.Contains(got, want) {
			t.Errorf("table %q does not contain %s", got, want)
		}
	}
	var errb bytes.Buffer
	printError(&errb, errString("lease \x1b[2Jgone"))
	if strings.Contains(errb.String(), "\x1b") || !strings.Contains(errb.String(), `\x1b[2J`) {
		t.Fatalf("error line %q", errb.String())
	}
	for in, want := range map[string]string{"plain text": "plain text", "ünï": "ünï", "bad\xffbyte": `bad\xffbyte`, "tab\there": `tab\there`} {
		if got := safe(in); got != want {
			t.Errorf("safe(%q) = %q, want %q", in, got, want)
		}
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// End to end: a reason with an escape sequence sent through the CLI is
// stored without it (the server strips control characters) and printed
// without it.
func TestReleaseReasonIsCleaned(t *testing.T) {
	s := orchtest.Start(t, nil)
	code, out, errs := runCLI(t, s, "acquire", "--conversation", "c-esc", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: %d %s", code, errs)
	}
	var acq struct {
		Lease struct{ ID string } `json:"lease"`
	}
	if err := json.Unmarshal([]byte(out), &acq); err != nil {
		t.Fatal(err)
	}
	id := acq.Lease.ID
	code, out, errs = runCLI(t, s, "release", id, "--reason", "done \x1b[31mred\x1b[0m "+strings.Repeat("x", 2000))
	if code != 0 {
		t.Fatalf("release: %d %s", code, errs)
	}
	if strings.Contains(out, "\x1b") || !strings.Contains(out, "done [31mred[0m xxx") {
		t.Fatalf("release output %q", out)
	}
	code, out, _ = runCLI(t, s, "get", id, "-o", "json")
	var got struct{ Reason string }
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	reason := got.Reason
	if code != 0 || strings.Contains(reason, "\x1b") || len(reason) > 512 || !strings.HasPrefix(reason, "done [31mred[0m x") {
		t.Fatalf("stored reason (%d bytes) %q", len(reason), reason)
	}
}
