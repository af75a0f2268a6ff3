package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// takeoverPage is a tenant's page that tries to take over the dashboard
// of whoever opens it on the orchestrator's origin: it reads the
// dashboard's session (its CSRF value) from sessionStorage, lists every
// owner's leases through the dashboard's API shim and releases the one
// named victim. It writes what it managed into the title, as JSON.
const takeoverPage = `<!doctype html><html><body><p id="ran">scripts run</p><script>
(async () => {
  const out = {scripts: true};
  let csrf = '';
  try {
    const s = JSON.parse(sessionStorage.getItem('berth.ui.session') || 'null');
    csrf = (s && s.csrf) || '';
    out.storage = csrf ? 'read' : 'empty';
  } catch (e) { out.storage = 'denied: ' + e.name; }
  try {
    const r = await fetch('/ui/api/v1/leases', {credentials: 'include', headers: {'X-Berth-CSRF': csrf}});
    out.list = r.status;
    out.listBody = (await r.text()).slice(0, 2000);
  } catch (e) { out.list = 'error: ' + e.name; }
  try {
    const r = await fetch('/ui/api/v1/leases/VICTIM?reason=taken', {method: 'DELETE', credentials: 'include', headers: {'X-Berth-CSRF': csrf}});
    out.release = r.status;
  } catch (e) { out.release = 'error: ' + e.name; }
  document.title = 'done:' + JSON.stringify(out);
})();
</script></body></html>`

// TestPreviewCannotTakeOverDashboard performs the attack of issue 21 item
// 4 in Chromium: the operator signs in to the dashboard, then opens, in
// the same tab, a path-form preview of a tenant's public port (served on
// the orchestrator's origin without a token). The tenant's page must not
// read the dashboard's session, list other owners' leases or release
// them; and its scripts still run (the page is confined, not broken).
func TestPreviewCannotTakeOverDashboard(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir, withTenants)
	victim := mustTenantLease(t, o.api, "c-ui-victim", baseImage, "victim-"+randHex(4), teamAToken)
	code, b, r := tenantAcquire(t, o.api, "c-ui-attacker", map[string]any{"image": baseImage, "publicPorts": []int{8000}}, teamBToken)
	if code != http.StatusOK {
		t.Fatalf("the attacker's acquire: HTTP %d: %s", code, b)
	}
	attacker, atok := r.GetLease().GetId(), r.GetToken()
	page := strings.ReplaceAll(takeoverPage, "VICTIM", victim.GetLease().GetId())
	o.putFile(t, attacker, atok, "/workspace/www/index.html", []byte(page))
	if c, _, b := o.mustCall(t, http.MethodPost, sandboxPath(attacker, "/v1/processes"),
		map[string]any{"argv": []string{"python3", "-m", "http.server", "8000", "--directory", "/workspace/www"}}, atok); c != http.StatusOK {
		t.Fatalf("start the attacker's server: HTTP %d: %s", c, b)
	}
	preview := o.base + "/v1/sandboxes/" + attacker + "/ports/8000/index.html"
	if !eventually(30*time.Second, 50*time.Millisecond, func() bool {
		c, _, _, err := o.httpGet("", "/v1/sandboxes/"+attacker+"/ports/8000/index.html", nil)
		return err == nil && c == http.StatusOK
	}) {
		t.Fatal("the attacker's preview never answered")
	}

	br := newBrowser(t)
	run := func(name string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(br, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, actions...); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	run("sign in to the dashboard",
		chromedp.Navigate(o.base+"/ui"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), operatorToken),
		chromedp.Click(chromedp.CSS(`#login-form button[type=submit]`)),
		chromedp.WaitVisible(chromedp.ID("view-leases")),
	)
	run("open the tenant's preview in the same tab", chromedp.Navigate(preview))
	var title string
	deadline := time.Now().Add(30 * time.Second)
	for !strings.HasPrefix(title, "done:") {
		if time.Now().After(deadline) {
			t.Fatalf("the page's script did not finish: title %q", title)
		}
		ctx, cancel := context.WithTimeout(br, 10*time.Second)
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.title`))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		title = v
		time.Sleep(100 * time.Millisecond)
	}
	var got struct {
		Scripts  bool
		Storage  string
		List     any
		ListBody string
		Release  any
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(title, "done:")), &got); err != nil {
		t.Fatalf("the page's result %q: %v", title, err)
	}
	t.Logf("the tenant's page: scripts %t, storage %q, list %v, release %v", got.Scripts, got.Storage, got.List, got.Release)
	if !got.Scripts {
		t.Error("the preview's scripts did not run")
	}
	if got.Storage == "read" {
		t.Error("the preview read the dashboard's session (its CSRF value) from sessionStorage")
	}
	if fmt.Sprint(got.List) == "200" || strings.Contains(got.ListBody, victim.GetLease().GetId()) {
		t.Errorf("the preview listed the leases through the dashboard: %v %s", got.List, got.ListBody)
	}
	if fmt.Sprint(got.Release) == "200" {
		t.Error("the preview released another owner's lease through the dashboard")
	}
	if st := o.mustGet(t, victim.GetLease().GetId()).GetState(); st != orchv1.LeaseState_LEASE_STATE_READY {
		t.Errorf("the victim's lease is %s", st)
	}
}
