package layering

import (
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/berth-dev/berth/"

// rule forbids the packages matching from (and their subpackages) to depend,
// directly or not, on any package under a forbidden prefix, except allow.
type rule struct {
	from   []string
	forbid []string
	allow  []string
}

// rules is the layering as it holds today (docs/development.md).
var rules = []rule{
	{ // the runtime layer knows nothing of leases, the orchestrator or the proxy
		from:   []string{"pkg/runtime"},
		forbid: []string{"pkg/lease", "pkg/orchestrator", "pkg/proxy"},
	},
	{ // the agent is built into every sandbox: no orchestrator-side code
		from: []string{"pkg/agent", "cmd/sandbox-agent"},
		forbid: []string{"pkg/lease", "pkg/orchestrator", "pkg/proxy",
			"pkg/runtime/docker", "pkg/runtime/containerd", "pkg/runtime/kubernetes"},
		// the shim log format the agent writes and the backend reads
		allow: []string{"pkg/runtime/containerd/shimlog"},
	},
	{ // leases run on the runtime interface, never on a backend
		from: []string{"pkg/lease"},
		forbid: []string{"pkg/orchestrator", "pkg/proxy",
			"pkg/runtime/docker", "pkg/runtime/containerd", "pkg/runtime/kubernetes", "pkg/runtime/inproc"},
	},
	{ // each backend stands alone
		from:   []string{"pkg/runtime/docker"},
		forbid: []string{"pkg/runtime/containerd", "pkg/runtime/kubernetes", "pkg/runtime/inproc"},
	},
	{
		from:   []string{"pkg/runtime/containerd"},
		forbid: []string{"pkg/runtime/docker", "pkg/runtime/kubernetes", "pkg/runtime/inproc"},
	},
	{
		from:   []string{"pkg/runtime/kubernetes"},
		forbid: []string{"pkg/runtime/docker", "pkg/runtime/containerd", "pkg/runtime/inproc"},
	},
	{
		// The server runs on the Platform cmd/orchestrator builds.
		from:   []string{"pkg/orchestrator", "pkg/proxy"},
		forbid: []string{"pkg/runtime/docker", "pkg/runtime/containerd", "pkg/runtime/kubernetes", "pkg/runtime/inproc"},
	},
}

// under reports whether import path p is pkg or below it (pkg relative to the module).
func under(p, pkg string) bool {
	return p == mod+pkg || strings.HasPrefix(p, mod+pkg+"/")
}

func anyUnder(p string, pkgs []string) bool {
	for _, pkg := range pkgs {
		if under(p, pkg) {
			return true
		}
	}
	return false
}

type goPkg struct {
	ImportPath string
	Deps       []string
}

// listPackages runs go list -json on the module's packages (non-test dependencies).
func listPackages(t *testing.T) []goPkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Deps", mod+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []goPkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// violations lists "pkg imports dep" for every broken rule.
func violations(pkgs []goPkg, rules []rule) []string {
	var bad []string
	for _, p := range pkgs {
		for _, r := range rules {
			if !anyUnder(p.ImportPath, r.from) {
				continue
			}
			for _, d := range p.Deps {
				if anyUnder(d, r.forbid) && !anyUnder(d, r.allow) && !anyUnder(d, r.from) {
					bad = append(bad, p.ImportPath+" imports "+d)
				}
			}
		}
	}
	return bad
}

func TestLayering(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; expected the whole module", len(pkgs))
	}
	for _, v := range violations(pkgs, rules) {
		t.Errorf("layering broken (docs/development.md): %s", v)
	}
}

// TestLayeringCatches checks the check: a forbidden import is reported.
func TestLayeringCatches(t *testing.T) {
	pkgs := []goPkg{
		{ImportPath: mod + "pkg/runtime/docker", Deps: []string{mod + "pkg/runtime", mod + "pkg/lease"}},
		{ImportPath: mod + "cmd/sandbox-agent", Deps: []string{mod + "pkg/runtime/containerd/shimlog"}},
		{ImportPath: mod + "pkg/lease/kubestore", Deps: []string{mod + "pkg/lease"}},
	}
	got := violations(pkgs, rules)
	want := mod + "pkg/runtime/docker imports " + mod + "pkg/lease"
	if len(got) != 1 || got[0] != want {
		t.Fatalf("violations = %q, want [%q]", got, want)
	}
}
