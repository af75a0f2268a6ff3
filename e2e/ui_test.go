package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestDashboard drives the web dashboard (/ui) in Debian's headless
// chromium against an orchestrator on the real Docker backend: it signs in
// with the operator token, watches a lease appear and go READY as the test
// acquires it and RELEASED as the test releases it, opens a second lease's
// page (its transitions, its log, and its background process, read from the
// agent through the proxy), types a command in its browser terminal (when
// built in), freezes and resumes it with the buttons, clicks
// Release there, and saves screenshots (login, leases light and dark, lease
// page, terminal, paused, released) under $BERTH_ARTIFACTS, or a temporary directory
// whose path it logs.
func TestDashboard(t *testing.T) {
	requireImage(t, baseImage)
	dataDir, _ := newDataDir(t)
	o := startOrch(t, dataDir)
	b := newBrowser(t)
	shots := artifactsDir(t)

	step := func(name string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	eval := func(expr string) any {
		t.Helper()
		ctx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[any](expr, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("eval %s: %v", expr, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(b, 30*time.Second)
		defer cancel()
		// From the top, so that the sticky bar is where it belongs.
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.scrollTo(0, 0), true`)); err != nil {
			t.Fatal(err)
		}
		// The terminal card alone, as the viewport shows it: a full-page
		// capture resizes the viewport, which makes xterm refit and
		// repaint after the capture (a blank terminal in the picture).
		var png []byte
		var err error
		if name == "terminal" {
			if _, err = chromedp.Run(ctx, chromedp.ScrollIntoView(chromedp.ID("t-box"))); err == nil {
				time.Sleep(300 * time.Millisecond)
				png, err = chromedp.Run(ctx, chromedp.Screenshot(chromedp.ID("t-box")))
			}
		} else {
			png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100)) // PNG
		}
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		p := filepath.Join(shots, "ui-"+name+".png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s", p)
	}
	// waitJS polls a JavaScript expression until it is true.
	waitJS := func(what, expr string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for eval(expr) != true {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %s; the page reads:\n%v", what, timeout, eval(`document.body.innerText`))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	input := func(id, value string) {
		t.Helper()
		eval(fmt.Sprintf(`(e => { e.value = %q; e.dispatchEvent(new Event('input')); return true })(document.getElementById(%q))`, value, id))
	}
	colorScheme := func(v string) {
		t.Helper()
		_, err := chromedp.Call(b, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: v}}})
		if err != nil {
			t.Fatalf("prefers-color-scheme %s: %v", v, err)
		}
	}
	row := func(id, state string) string {
		return fmt.Sprintf(`!!document.querySelector('#leases tr[data-id=%q][data-state=%q]')`, id, state)
	}

	// Sign in. The token goes in a POST body, never in the URL.
	step("open /ui", chromedp.Navigate(o.base+"/ui"), chromedp.WaitVisible(chromedp.ID("token")))
	shot("login")
	step("sign in",
		chromedp.SendKeys(chromedp.ID("token"), operatorToken),
		chromedp.Click(chromedp.CSS(`#login-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.ID("view-leases")),
	)
	waitJS("the watch stream is live", `document.querySelector('#live').classList.contains('ok')`, 15*time.Second)
	if loc := eval(`location.href`).(string); strings.Contains(loc, operatorToken) {
		t.Fatalf("the token is in the URL after sign-in: %s", loc)
	}
	if c := eval(`document.cookie`).(string); strings.Contains(c, "berth_ui") {
		t.Fatalf("the session cookie is readable by scripts: %q", c)
	}
	// Show ended leases too, so the release below stays visible.
	input("f-state", "all")

	// A lease appears and goes READY as the test acquires it.
	acquire := func(conv string, labels map[string]string) *orchv1.AcquireResponse {
		t.Helper()
		code, _, body := o.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{
			"conversationId": conv, "image": baseImage, "ttl": "900s", "labels": labels})
		if code != http.StatusOK {
			t.Fatalf("acquire %s: HTTP %d: %s", conv, code, body)
		}
		var r orchv1.AcquireResponse
		if err := decode(body, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	t0 := time.Now()
	first := acquire("ui-e2e-first", map[string]string{"team": "payments", "env": "ci"})
	a := first.GetLease().GetId()
	waitJS("lease "+a+" READY in the table", row(a, "READY"), 15*time.Second)
	t.Logf("lease %s READY in the table %s after the acquire began", a, time.Since(t0).Round(time.Millisecond))
	second := acquire("ui-e2e-second", map[string]string{"team": "search"})
	bid := second.GetLease().GetId()
	waitJS("lease "+bid+" READY in the table", row(bid, "READY"), 15*time.Second)

	// A background process, for the lease page's process table.
	code, _, body := o.mustCall(t, http.MethodPost, sandboxPath(bid, "/v1/processes"),
		map[string]any{"command": "sleep 600"}, second.GetToken())
	if code != http.StatusOK {
		t.Fatalf("start process: HTTP %d: %s", code, body)
	}
	shot("leases")

	// The label filter.
	input("f-label", "team=payments")
	waitJS("the label filter shows only the first lease", fmt.Sprintf(`%s && !document.querySelector('#leases tr[data-id=%q]')`, row(a, "READY"), bid), 5*time.Second)
	input("f-label", "")

	// The test releases the first lease: its row turns RELEASED.
	t0 = time.Now()
	if l := o.mustRelease(t, a); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED {
		t.Fatalf("release %s: state %s", a, l.GetState())
	}
	waitJS("lease "+a+" RELEASED in the table", row(a, "RELEASED"), 15*time.Second)
	t.Logf("lease %s RELEASED in the table %s after the release began", a, time.Since(t0).Round(time.Millisecond))

	// Dark mode, same page.
	colorScheme("dark")
	time.Sleep(200 * time.Millisecond)
	shot("leases-dark")
	colorScheme("light")

	// The second lease's page: transitions, usage, the process from the agent.
	step("open the lease page", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#leases tr[data-id=%q] a`, bid))),
		chromedp.WaitVisible(chromedp.ID("view-lease")))
	waitJS("lease page READY", `document.querySelector('#l-state').textContent === 'READY'`, 10*time.Second)
	waitJS("the transitions are listed", `document.querySelectorAll('#l-transitions tbody tr').length >= 2`, 10*time.Second)
	waitJS("the background process is listed", `[...document.querySelectorAll('#l-processes tbody td')].some(td => td.textContent.includes('sleep 600'))`, 15*time.Second)
	waitJS("the log shows the lease's transitions", `[...document.querySelectorAll('#l-log .logline')].some(l => l.textContent.includes('acquired'))`, 15*time.Second)
	time.Sleep(300 * time.Millisecond)
	shot("lease")

	// The browser terminal, when it was built in (make build and make test
	// run scripts/ui-xterm.sh first): a shell in the sandbox.
	if eval(`JSON.parse(sessionStorage.getItem('berth.ui.session')).terminal === true`) == true {
		step("open the terminal", chromedp.Click(chromedp.ID("t-open")), chromedp.WaitVisible(chromedp.CSS(".xterm-helper-textarea")))
		waitJS("the terminal session opened", `document.getElementById('t-note').textContent.startsWith('session t-')`, 15*time.Second)
		step("type a command", chromedp.SendKeys(chromedp.CSS(".xterm-helper-textarea"), "echo ui-$((6*7))\r"))
		waitJS("its output in the terminal", `document.getElementById('t-box').textContent.includes('ui-42')`, 15*time.Second)
		shot("terminal")
		// The button in the middle of the viewport first: the screenshot
		// scrolled the terminal box to the top, where the sticky bar can
		// cover the card's heading and take the click.
		eval(`document.getElementById('t-close').scrollIntoView({block: 'center'}), true`)
		step("detach", chromedp.Click(chromedp.ID("t-close")))
		waitJS("the terminal detached", `document.getElementById('t-note').textContent.startsWith('detached')`, 5*time.Second)
	} else {
		testenv.LogOrFail(t, "the dashboard was built without its browser terminal: run scripts/ui-xterm.sh (make build) before the test")
	}

	// Freeze and resume from the UI; a paused lease's processes are not
	// read (that would resume it).
	step("click freeze", chromedp.Click(chromedp.CSS(`#l-actions button[data-act="freeze"]`)))
	waitJS("lease page PAUSED", `document.querySelector('#l-state').textContent === 'PAUSED'`, 15*time.Second)
	if l := o.mustGet(t, bid); l.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED || l.GetPaused() != "freeze" {
		t.Fatalf("after Freeze: lease %s is %s (%q)", bid, l.GetState(), l.GetPaused())
	}
	step("refresh processes", chromedp.Click(chromedp.ID("p-refresh")))
	waitJS("no process read from a paused lease", `document.querySelector('#p-note').textContent.includes('READY sandbox only')`, 5*time.Second)
	if l := o.mustGet(t, bid); l.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED {
		t.Fatalf("looking at the paused lease resumed it: %s", l.GetState())
	}
	shot("lease-paused")
	step("click resume", chromedp.Click(chromedp.CSS(`#l-actions button[data-act="resume"]`)))
	waitJS("lease page READY again", `document.querySelector('#l-state').textContent === 'READY'`, 15*time.Second)

	// Release from the UI: two clicks (the button asks once more).
	release := chromedp.CSS(`#l-actions button[data-act="release"]`)
	step("click release", chromedp.Click(release))
	waitJS("release asks for confirmation", `document.querySelector('#l-actions button[data-act="release"]').classList.contains('confirm')`, 5*time.Second)
	step("confirm release", chromedp.Click(release))
	waitJS("lease page RELEASED", `document.querySelector('#l-state').textContent === 'RELEASED'`, 30*time.Second)
	if l := o.mustGet(t, bid); l.GetState() != orchv1.LeaseState_LEASE_STATE_RELEASED || !strings.Contains(l.GetReason(), "dashboard") {
		t.Fatalf("after the click: lease %s is %s (%q), want RELEASED by the dashboard", bid, l.GetState(), l.GetReason())
	}
	waitJS("the actions are disabled", `document.querySelector('#l-actions button[data-act="release"]').disabled`, 5*time.Second)
	shot("released")

	// Sign out clears the session: the API shim refuses the tab afterwards.
	step("sign out", chromedp.Click(chromedp.ID("signout")), chromedp.WaitVisible(chromedp.ID("token")))
	if st := eval(`fetch('/ui/api/v1/leases').then(r => r.status)`); st != float64(http.StatusUnauthorized) {
		t.Fatalf("the API shim after sign-out: HTTP %v, want 401", st)
	}
}

// newBrowser starts Debian's headless chromium (as root with --no-sandbox)
// and returns its tab's context; it is stopped, and waited for, when the
// test ends.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		testenv.SkipOrFail(t, "chromium not found: install Debian's chromium (scripts/deps.sh)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(1440, 900),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("lang", "en-US"),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // kills chromium and waits for it
	})
	// The first action starts the browser: no timeout on it (a timeout
	// would stop the browser with it).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// artifactsDir is $BERTH_ARTIFACTS (created if needed), or a temporary
// directory for this test.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BERTH_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
		t.Logf("screenshots go to %s (removed after the test; set BERTH_ARTIFACTS to keep them)", dir)
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
