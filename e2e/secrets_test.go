package e2e

import (
	"bytes"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// TestSecretMaskedThroughProxy acquires a Docker sandbox with a secret and
// runs `orchestrator exec` through the proxy: the command gets the value
// in its environment, the output shows <secret:TOKEN> where the value was
// printed as is and (as documented) the value itself once transformed; the
// secrets survive an in-place restart; the lease shows only the name, and neither the orchestrator's log nor a file
// of the data dir holds the value.
func TestSecretMaskedThroughProxy(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	addr := freeAddr(t)
	p := startProc(t, dir, addr)
	a := newAPI(addr)
	defer a.close()

	const val = "sk-e2e-secret-abcdef"
	code, _, b := a.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{
		"conversationId": "secrets-" + randHex(4), "image": baseImage, "ttl": "600s",
		"secrets": map[string]string{"TOKEN": val}, "env": map[string]string{"PLAIN": "plain-value"},
	})
	if code != http.StatusOK {
		t.Fatalf("acquire: %d %s", code, b)
	}
	var acq orchv1.AcquireResponse
	if err := decode(b, &acq); err != nil {
		t.Fatal(err)
	}
	id := acq.GetLease().GetId()
	defer a.mustRelease(t, id)
	if bytes.Contains(b, []byte(val)) || strings.Join(acq.GetLease().GetSecretNames(), ",") != "TOKEN" {
		t.Errorf("acquire answer: %s", b)
	}

	out, errs, rc := cliExec(t, addr, acq.GetToken(), "", nil, id, "--", "sh", "-c",
		`echo $TOKEN; echo $TOKEN | tr a-z A-Z; echo "plain=$PLAIN agent=${BERTH_AGENT_SECRETS:-unset}"; echo $TOKEN >&2`)
	if rc != 0 {
		t.Fatalf("exec: exit %d: %s", rc, errs)
	}
	want := "<secret:TOKEN>\n" + strings.ToUpper(val) + "\nplain=plain-value agent=unset\n"
	if out != want || !strings.Contains(errs, "<secret:TOKEN>") || strings.Contains(errs, val) {
		t.Errorf("exec stdout %q (want %q), stderr %q", out, want, errs)
	}

	// A sandbox restarted in place keeps its secrets (the engine keeps the
	// container's environment) and its agent masks them again.
	mustDocker(t, "kill", acq.GetLease().GetContainerId())
	waitRestarted(t, a, id, 1, 30*time.Second)
	out, errs, rc = cliExec(t, addr, acq.GetToken(), "", nil, id, "--", "sh", "-c", `echo $TOKEN; echo ${#TOKEN}`)
	if want := "<secret:TOKEN>\n" + strconv.Itoa(len(val)) + "\n"; rc != 0 || out != want {
		t.Errorf("exec after restart: exit %d, stdout %q (want %q), stderr %q", rc, out, want, errs)
	}

	// get and list show the name only.
	for _, path := range []string{"/v1/leases/" + id, "/v1/leases"} {
		_, _, b := a.mustCall(t, http.MethodGet, path, nil)
		if bytes.Contains(b, []byte(val)) || !bytes.Contains(b, []byte(`"secretNames":["TOKEN"]`)) {
			t.Errorf("GET %s: %s", path, b)
		}
	}
	// Neither the orchestrator's (debug) log nor any file of the data dir
	// holds the value.
	if b, err := os.ReadFile(p.logPath); err != nil || bytes.Contains(b, []byte(val)) {
		t.Errorf("orchestrator log %s: %v, or it holds the secret's value", p.logPath, err)
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(val)) {
			t.Errorf("%s holds the secret's value", p)
		}
		return nil
	})
}

// TestContainerdSecretMasked: the containerd backend passes secrets to the
// sandbox's environment and names them for the agent, which masks them.
func TestContainerdSecretMasked(t *testing.T) {
	requireCtrdImage(t, minimalImage)
	o := startCtrdOrch(t, newCtrdEnv(t))
	const val = "sk-ctrd-secret-abcdef"
	code, _, b := o.mustCall(t, http.MethodPost, "/v1/leases", map[string]any{
		"conversationId": "c-ctrd-secret", "image": minimalImage, "ttl": "600s", "secrets": map[string]string{"TOKEN": val},
	})
	if code != http.StatusOK {
		t.Fatalf("acquire: %d %s", code, b)
	}
	var acq orchv1.AcquireResponse
	if err := decode(b, &acq); err != nil {
		t.Fatal(err)
	}
	o.env.track(acq.GetLease().GetContainerId())
	res := o.mustProxyExec(t, acq.GetLease().GetId(), acq.GetToken(), "sh", "-c", `echo $TOKEN; echo ${#TOKEN}; echo ${BERTH_AGENT_SECRETS:-unset}`)
	if want := "<secret:TOKEN>\n" + strconv.Itoa(len(val)) + "\nunset\n"; res.Stdout != want {
		t.Errorf("exec stdout %q, want %q (stderr %q)", res.Stdout, want, res.Stderr)
	}
}
