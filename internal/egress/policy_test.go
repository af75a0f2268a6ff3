package egress

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestParseEntry(t *testing.T) {
	good := map[string]string{
		"10.0.0.0/8":          "10.0.0.0/8",
		"10.1.2.3/8":          "10.0.0.0/8",
		"192.0.2.7":           "192.0.2.7",
		"192.0.2.7:443":       "192.0.2.7:443",
		"Example.COM.":        "example.com",
		"*.example.com":       "*.example.com",
		"api.example.com:443": "api.example.com:443",
		"*.svc.test:8080":     "*.svc.test:8080",
		"under_score.test":    "under_score.test",
	}
	for in, want := range good {
		e, err := ParseEntry(in)
		if err != nil {
			t.Errorf("ParseEntry(%q): %v", in, err)
			continue
		}
		if e.String() != want {
			t.Errorf("ParseEntry(%q) = %q, want %q", in, e.String(), want)
		}
	}
	for _, in := range []string{"", "10.0.0.0/33", "::1", "[::1]:80", "2001:db8::/32", "a..b", "-a.b", "ex ample.com",
		"example.com:0", "example.com:65536", "example.com:http", "*.com", "*", "a/b", "x:1:2"} {
		if e, err := ParseEntry(in); err == nil {
			t.Errorf("ParseEntry(%q) = %+v, want an error", in, e)
		}
	}
}

func TestCompileNamesField(t *testing.T) {
	_, err := Compile(Policy{Mode: "closed"})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "network.mode") {
		t.Errorf("bad mode: %v", err)
	}
	_, err = Compile(Policy{Allow: []string{"ok.test", "bad..test"}})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "network.allow[1]") {
		t.Errorf("bad allow: %v", err)
	}
	_, err = Compile(Policy{Deny: make([]string, MaxEntries+1)})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "network.deny") {
		t.Errorf("long deny: %v", err)
	}
	p, err := Normalize(Policy{Allow: []string{"A.test", "a.test", "10.0.0.1/8"}})
	if err != nil || p.Mode != ModeOpen || !slices.Equal(p.Allow, []string{"a.test", "10.0.0.0/8"}) {
		t.Errorf("Normalize = %+v, %v", p, err)
	}
}

func TestNameVerdict(t *testing.T) {
	c, err := Compile(Policy{Mode: ModeRestricted,
		Allow: []string{"exact.test", "*.wild.test:443", "both.test:80", "both.test:81"},
		Deny:  []string{"bad.wild.test", "both.test:81"}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		resolve bool
		allow   []int
	}{
		{"exact.test", true, []int{0}},
		{"sub.exact.test", false, nil},
		{"a.wild.test", true, []int{443}},
		{"wild.test", false, nil},
		{"bad.wild.test", false, nil},
		{"both.test", true, []int{80, 81}},
		{"other.test", false, nil},
	}
	for _, tc := range cases {
		v := c.Name(tc.name)
		if v.Resolve != tc.resolve || (tc.resolve && !slices.Equal(v.AllowPorts, tc.allow)) {
			t.Errorf("Name(%q) = %+v, want resolve=%v allow=%v", tc.name, v, tc.resolve, tc.allow)
		}
	}
	if v := c.Name("both.test"); !slices.Equal(v.DenyPorts, []int{81}) {
		t.Errorf("both.test deny ports = %v", v.DenyPorts)
	}
	open, _ := Compile(Policy{Deny: []string{"gone.test"}})
	if open.Name("gone.test").Resolve || !open.Name("any.test").Resolve {
		t.Error("open mode: a denied name resolves or another does not")
	}
	none, _ := Compile(Policy{Mode: ModeNone, Allow: []string{"x.test"}})
	if none.Name("x.test").Resolve {
		t.Error("mode none resolved a name")
	}
}
