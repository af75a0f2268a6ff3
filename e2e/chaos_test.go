package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"
)

// The fault suite ("chaos"): one test, TestChaos, runs every fault against
// real orchestrator binaries (subprocesses, so they can be SIGKILLed) on the
// real Docker Engine and prints one table of figures at the end. `make test`
// runs a small subset (chaosSizes small); `make chaos` sets BERTH_CHAOS=full
// and runs it in full. docs/chaos.md describes every row.

// chaosEnv selects the full suite when set to "full".
const chaosEnv = "BERTH_CHAOS"

// chaosSizes are the repetition counts of the rows.
type chaosSizes struct {
	full bool
	// killRounds is how many times the orchestrator is SIGKILLed during 20
	// concurrent acquires.
	killRounds int
	// sandboxRuns is how many times each sandbox fault runs.
	sandboxRuns int
	// stormRuns is how many acquire storms run.
	stormRuns int
	// fuzzRequests is the number of fuzzed requests; fuzzSeed seeds them.
	fuzzRequests int
	fuzzSeed     int64
	// slowConns is the number of slowloris connections; slowFor how long
	// the attack lasts.
	slowConns int
	slowFor   time.Duration
}

func chaosConfig() chaosSizes {
	if os.Getenv(chaosEnv) == "full" {
		return chaosSizes{full: true, killRounds: 10, sandboxRuns: 2, stormRuns: 3, fuzzRequests: 10000, fuzzSeed: 1, slowConns: 200, slowFor: 3*chaosHeaderTimeout + 5*time.Second}
	}
	return chaosSizes{killRounds: 2, sandboxRuns: 1, stormRuns: 1, fuzzRequests: 1000, fuzzSeed: 1, slowConns: 200, slowFor: chaosHeaderTimeout + 3*time.Second}
}

// chaosRow is one line of the table.
type chaosRow struct {
	mu      sync.Mutex // guards pass and problems
	order   int        // the table is sorted by it
	name    string
	runs    int
	pass    bool
	figures string
	// took is the row's wall time (the first rows overlap: see TestChaos).
	took time.Duration
	// problems say why a row failed (printed under the table).
	problems []string
}

// chaosTable collects the rows of one TestChaos run.
type chaosTable struct {
	mu   sync.Mutex
	rows []*chaosRow
}

func (c *chaosTable) add(r *chaosRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rows = append(c.rows, r)
}

// print writes the table and the summary line to w.
func (c *chaosTable) print(w io.Writer, cfg chaosSizes) {
	c.mu.Lock()
	defer c.mu.Unlock()
	mode := "subset (make test)"
	if cfg.full {
		mode = "full (make chaos)"
	}
	fmt.Fprintf(w, "\nchaos: %s, run %s, %s\n", mode, runID, time.Now().UTC().Format(time.RFC3339))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\truns\tresult\ttook\tfigures")
	fmt.Fprintln(tw, "---\t----\t------\t----\t-------")
	sort.SliceStable(c.rows, func(i, j int) bool { return c.rows[i].order < c.rows[j].order })
	passed, failed := 0, 0
	for _, r := range c.rows {
		res := "PASS"
		if r.pass {
			passed++
		} else {
			res = "FAIL"
			failed++
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0fs\t%s\n", r.name, r.runs, res, r.took.Seconds(), r.figures)
	}
	_ = tw.Flush()
	for _, r := range c.rows {
		for _, p := range r.problems {
			fmt.Fprintf(w, "  FAIL %s: %s\n", r.name, p)
		}
	}
	fmt.Fprintf(w, "chaos: %d passed, %d failed\n", passed, failed)
}

// fail marks the row failed with a reason and reports it to t.
func (r *chaosRow) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.pass = false
	r.problems = append(r.problems, msg)
	r.mu.Unlock()
	t.Errorf("%s: %s", r.name, msg)
}

// TestChaos runs the fault suite and prints its table (to stdout, so that
// `make chaos` shows it without -v).
func TestChaos(t *testing.T) {
	requireImage(t, minimalImage)
	requireImage(t, baseImage)
	cfg := chaosConfig()
	table := &chaosTable{}
	t0 := time.Now()
	defer func() {
		table.print(os.Stdout, cfg)
		fmt.Printf("chaos: took %s\n", time.Since(t0).Round(time.Second))
	}()
	// The rows that check correctness under load run at the same time (each
	// on its own orchestrator); the fuzz and the latency measurement of the
	// slowloris row run alone afterwards.
	t.Run("Engine", func(t *testing.T) {
		t.Run("KillDuringAcquire", func(t *testing.T) { t.Parallel(); chaosKillDuringAcquire(t, cfg, table) })
		t.Run("SandboxFaults", func(t *testing.T) { t.Parallel(); chaosSandboxFaults(t, cfg, table) })
		t.Run("SandboxFaultsContainerd", func(t *testing.T) { t.Parallel(); chaosSandboxFaultsContainerd(t, cfg, table) })
		t.Run("AcquireStorm", func(t *testing.T) { t.Parallel(); chaosAcquireStorm(t, cfg, table) })
	})
	t.Run("Fuzz", func(t *testing.T) { chaosFuzz(t, cfg, table) })
	t.Run("Slowloris", func(t *testing.T) { chaosSlowloris(t, cfg, table) })
}

// procHealth reports panics and fatal errors in an orchestrator's log and
// whether the process exited on its own; "" when all is well.
func procHealth(p *proc) string {
	var probs []string
	select {
	case <-p.done:
		probs = append(probs, fmt.Sprintf("orchestrator exited on its own: %v", p.waitErr))
	default:
	}
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "read log: " + err.Error()
	}
	panics := 0
	var first string
	for _, line := range strings.Split(string(b), "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "panic") || strings.HasPrefix(l, "fatal error") {
			if first == "" {
				first = line
			}
			panics++
		}
	}
	if panics > 0 {
		if len(first) > 300 {
			first = first[:300] + "…"
		}
		probs = append(probs, fmt.Sprintf("%d log line(s) with a panic or fatal error, first: %s", panics, first))
	}
	return strings.Join(probs, "; ")
}

// panicLines counts the lines of an orchestrator log that mention a panic
// or a Go fatal error.
func panicLines(p *proc) int {
	b, _ := os.ReadFile(p.logPath)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "panic") || strings.HasPrefix(l, "fatal error") {
			n++
		}
	}
	return n
}

// chaosExecResult is the agent's exec answer (execResult plus the fields
// the faults look at).
type chaosExecResult struct {
	ExitCode  int    `json:"exitCode"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Signal    string `json:"signal"`
	TimedOut  bool   `json:"timedOut"`
	OOMKilled bool   `json:"oomKilled"`
}

// chaosExec runs argv in lease id's sandbox through the proxy
// (POST /v1/sandboxes/{id}/v1/exec) with token and a command timeout; body
// is the answer's body when it is not 200.
func (a *api) chaosExec(id, token string, timeout time.Duration, argv ...string) (int, chaosExecResult, string, error) {
	return a.chaosExecAs(id, token, "", timeout, argv...)
}

// chaosExecAs is chaosExec as user ("" for the lease's).
func (a *api) chaosExecAs(id, token, user string, timeout time.Duration, argv ...string) (int, chaosExecResult, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	body := map[string]any{"argv": argv, "timeout": fmt.Sprintf("%ds", int(timeout.Seconds()))}
	if user != "" {
		body["user"] = user
	}
	j, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+sandboxPath(id, "/v1/exec"), bytes.NewReader(j))
	if err != nil {
		return 0, chaosExecResult{}, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, chaosExecResult{}, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return resp.StatusCode, chaosExecResult{}, string(b), err
	}
	var r chaosExecResult
	if err := json.Unmarshal(b, &r); err != nil {
		return resp.StatusCode, r, string(b), fmt.Errorf("decode exec response: %w", err)
	}
	return resp.StatusCode, r, "", nil
}

// execOK reports whether `sh -c script` exits 0 in the sandbox, with a
// description of what happened otherwise.
func (a *api) execOK(id, token, script string) (bool, string) {
	code, r, body, err := a.chaosExec(id, token, 20*time.Second, "/bin/sh", "-c", script)
	switch {
	case err != nil:
		return false, err.Error()
	case code != http.StatusOK:
		return false, fmt.Sprintf("HTTP %d: %s", code, trunc(body, 200))
	case r.ExitCode != 0:
		return false, fmt.Sprintf("exit %d: %s", r.ExitCode, trunc(r.Stderr, 200))
	}
	return true, r.Stdout
}

func trunc(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
