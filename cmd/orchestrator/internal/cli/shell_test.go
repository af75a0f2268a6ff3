package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

// shellSession matches the session line shell prints on stderr.
var shellSession = regexp.MustCompile(`session (t-[0-9a-f]{16}) \(re-attach with --attach t-[0-9a-f]{16}\)\n`)

// The shell command against a real orchestrator with in-process agents,
// stdin piped (no terminal): input typed into the session, output, the
// exit code, --attach with the replay, --list, --kill and their errors.
func TestShell(t *testing.T) {
	s := orchtest.Start(t, nil)
	_, out, _ := runCLI(t, s, "acquire", "--conversation", "shell", "-o", "json")
	id, tok := acquired(t, out)
	shell := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runTool(t, s, tok, tool{"shell", stdin}, args...)
	}

	envFile := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(envFile, []byte("# comment\nFROMFILE=f\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errs := shell("hello\n", "-e", "GREETING=hi", "-e", "BERTH_ADDR", "--env-file", envFile, id, "--",
		"sh", "-c", `read x; echo "got $GREETING $x $FROMFILE ${BERTH_ADDR%%:*}"; exit 5`)
	if code != 5 || !strings.Contains(out, "got hi hello f http") {
		t.Fatalf("shell: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	m := shellSession.FindStringSubmatch(errs)
	if m == nil || strings.Contains(errs, "detach with") {
		t.Fatalf("stderr %q: want the session line, without detach keys (stdin is no terminal)", errs)
	}
	sid := m[1]

	// A signal's death is 128+N.
	if code, out, errs := shell("", "--sh", id, "--", "echo $TERM; kill -TERM $$"); code != 128+15 || !strings.Contains(out, "xterm-256color") {
		t.Errorf("killed by TERM: exit %d, stdout %q, stderr %q", code, out, errs)
	}

	// An ended session can still be attached to: its output, its exit.
	code, out, errs = shell("", "--attach", sid, id)
	if code != 5 || !strings.Contains(out, "got hi hello") || !strings.Contains(errs, sid) {
		t.Errorf("--attach %s: exit %d, stdout %q, stderr %q", sid, code, out, errs)
	}
	if code, out, _ := shell("", "--attach", sid, "--no-replay", id); code != 5 || strings.Contains(out, "got") {
		t.Errorf("--attach --no-replay: exit %d, stdout %q", code, out)
	}

	code, out, errs = shell("", "--list", id)
	if code != 0 || !strings.HasPrefix(out, "ID") || !strings.Contains(out, sid) || !strings.Contains(out, "exited 5") {
		t.Errorf("--list: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, _ = shell("", "--list", "-o", "json", id)
	var list struct{ Sessions []struct{ ID string } }
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Sessions) != 2 {
		t.Errorf("--list -o json: exit %d, %q", code, out)
	}

	// A running session: listed as running, then killed (SIGHUP).
	done := make(chan string, 1)
	go func() {
		_, _, errs := runTool(t, s, tok, tool{"shell", ""}, id, "--", "sleep", "60")
		done <- errs
	}()
	var running string
	for range 200 {
		time.Sleep(50 * time.Millisecond)
		if _, out, _ := shell("", "--list", id); strings.Contains(out, "running") {
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "running") {
					running = strings.Fields(line)[0]
				}
			}
			break
		}
	}
	if running == "" {
		t.Fatal("the sleep session never showed as running")
	}
	if code, out, errs := shell("", "--kill", running, id); code != 0 || strings.TrimSpace(out) != running {
		t.Errorf("--kill: exit %d, %q %q", code, out, errs)
	}
	<-done

	// Errors, in words.
	if code, _, errs := shell("", "--attach", "t-0000000000000000", id); code != ExitExecFailed || !strings.Contains(errs, "(not found)") {
		t.Errorf("--attach unknown: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := shell("", id, "--", "no-such-program-here"); code != ExitNotFound || !strings.Contains(errs, "no-such-program-here") || !strings.Contains(errs, "(failed precondition)") {
		t.Errorf("missing program: exit %d, stderr %q", code, errs)
	}
	if code, _, errs := runTool(t, s, "wrong", tool{"shell", ""}, id); code != ExitExecFailed || !strings.Contains(errs, "(unauthenticated)") {
		t.Errorf("wrong token: exit %d, stderr %q", code, errs)
	}
}

// Usage mistakes of shell exit 2.
func TestShellUsage(t *testing.T) {
	for _, args := range [][]string{
		{"shell"},
		{"shell", "A", "B"},
		{"shell", "--list", "--attach", "t-1", "L"},
		{"shell", "--attach", "t-1", "L", "--", "sh"},
		{"shell", "--sh", "L"},
		{"shell", "--signal", "INT", "L"},
		{"shell", "--no-replay", "L"},
		{"shell", "-e", "=NONAME", "L"},
		{"shell", "--env-file", "/nonexistent/env", "L"},
		{"shell", "--detach-keys", "ctrl-", "L"},
		{"shell", "--list", "-o", "xml", "L"},
	} {
		if code, _, errs := runArgs(args...); code != ExitUsage || !strings.Contains(errs, "--help") {
			t.Errorf("%v: exit %d (want 2), stderr %q", args, code, errs)
		}
	}
}

func TestDetachKeys(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []byte
		text string
	}{
		{"ctrl-p,ctrl-q", []byte{0x10, 0x11}, "ctrl-p ctrl-q"},
		{"ctrl-A,d", []byte{1, 'd'}, "ctrl-a d"},
		{"ctrl-\\", []byte{0x1c}, `ctrl-\`},
		{"", nil, ""},
	} {
		got, err := parseDetachKeys(c.in)
		if err != nil || !bytes.Equal(got, c.want) || describeKeys(got) != c.text {
			t.Errorf("%q: %v %v %q", c.in, got, err, describeKeys(got))
		}
	}
	for _, bad := range []string{"ctrl-", "ctrl-1", "ab", ",", "\x01"} {
		if _, err := parseDetachKeys(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}

	keys := []byte{0x10, 0x11}
	for _, c := range []struct {
		chunks []string
		want   string
		hit    bool
	}{
		{[]string{"abc"}, "abc", false},
		{[]string{"ab\x10\x11cd"}, "ab", true},
		{[]string{"ab\x10", "\x11"}, "ab", true},
		{[]string{"ab\x10", "x"}, "ab\x10x", false}, // a lone ctrl-p is typed, late
		{[]string{"\x10\x10\x11"}, "\x10", true},    // the second ctrl-p starts the match again
		{[]string{"\x11\x10y\x10", "\x11z"}, "\x11\x10y", true},
	} {
		d := &detachKeys{keys: keys}
		var got []byte
		hit := false
		for _, ch := range c.chunks {
			out, h := d.filter([]byte(ch))
			got = append(got, out...)
			if h {
				hit = true
				break
			}
		}
		if string(got) != c.want || hit != c.hit {
			t.Errorf("%q: sent %q hit %t, want %q %t", c.chunks, got, hit, c.want, c.hit)
		}
	}
}
