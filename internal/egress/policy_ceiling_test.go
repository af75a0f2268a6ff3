package egress

import (
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestCeilingCheck(t *testing.T) {
	c := Ceiling{MaxMode: ModeRestricted, AlwaysDeny: []string{"10.0.0.0/8"},
		AllowCeiling: []string{"*.example.com", "api.test:443", "192.0.2.0/24"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ok := []Policy{
		{Mode: ModeNone},
		{Mode: ModeRestricted},
		{Mode: ModeRestricted, Allow: []string{"a.example.com", "*.b.example.com", "*.example.com", "x.example.com:80",
			"api.test:443", "192.0.2.7", "192.0.2.128/25:22"}},
	}
	for _, p := range ok {
		if err := c.Check(p); err != nil {
			t.Errorf("Check(%+v): %v", p, err)
		}
	}
	bad := map[string]Policy{
		"network.mode":       {Mode: ModeOpen},
		"network.mode ":      {}, // "" is open
		"network.allow[0]":   {Mode: ModeRestricted, Allow: []string{"example.com"}},
		"network.allow[1]":   {Mode: ModeRestricted, Allow: []string{"a.example.com", "api.test"}},
		"network.allow[2]":   {Mode: ModeRestricted, Allow: []string{"api.test:443", "192.0.2.1", "192.0.0.0/16"}},
		" network.allow[0]":  {Mode: ModeRestricted, Allow: []string{"api.test:80"}},
		"  network.allow[0]": {Mode: ModeRestricted, Allow: []string{"198.51.100.1"}},
	}
	for field, p := range bad {
		err := c.Check(p)
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("Check(%+v) = %v, want PERMISSION_DENIED naming %s", p, err, strings.TrimSpace(field))
		}
	}
	if err := c.Check(Policy{Mode: ModeOpen}); !strings.Contains(err.Error(), "max-network-mode restricted") {
		t.Errorf("the error does not name the ceiling: %v", err)
	}
	if err := c.Check(Policy{Mode: "wide"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad mode: %v, want INVALID_ARGUMENT", err)
	}
	// Deny lists are never bounded; none is under every ceiling.
	if err := (Ceiling{MaxMode: ModeNone}).Check(Policy{Mode: ModeNone, Deny: []string{"1.2.3.4"}}); err != nil {
		t.Error(err)
	}
	if err := (Ceiling{}).Check(Policy{Mode: ModeOpen}); err != nil {
		t.Errorf("the zero ceiling bounds: %v", err)
	}
}

func TestCeilingValidate(t *testing.T) {
	for want, c := range map[string]Ceiling{
		"max-network-mode":         {MaxMode: "wide"},
		"network-always-deny[1]":   {AlwaysDeny: []string{"10.0.0.0/8", "10.0.0.0/33"}},
		"network-allow-ceiling[0]": {MaxMode: ModeRestricted, AllowCeiling: []string{"*"}},
		"needs max-network-mode":   {AllowCeiling: []string{"example.com"}},
	} {
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", c, err, want)
		}
	}
	if (Ceiling{}).Bounded() || (Ceiling{MaxMode: ModeOpen}).Bounded() || !(Ceiling{AlwaysDeny: []string{"1.2.3.4"}}).Bounded() {
		t.Error("Bounded")
	}
}

func TestCeilingClamp(t *testing.T) {
	c := Ceiling{MaxMode: ModeRestricted, AlwaysDeny: []string{"10.0.0.0/8", "blocked.test"}, AllowCeiling: []string{"*.example.com"}}
	got, clamped := c.Clamp(Policy{Mode: ModeRestricted, Allow: []string{"a.example.com"}, Deny: []string{"blocked.test"}})
	if clamped || got.Mode != ModeRestricted || !slices.Equal(got.Allow, []string{"a.example.com"}) ||
		!slices.Equal(got.Deny, []string{"blocked.test", "10.0.0.0/8"}) {
		t.Errorf("a policy under the ceiling: %+v clamped %t", got, clamped)
	}
	// Recorded before the ceiling was lowered: open becomes restricted,
	// allow entries outside the ceiling go.
	got, clamped = c.Clamp(Policy{Mode: ModeOpen, Allow: []string{"a.example.com", "other.test"}})
	if !clamped || got.Mode != ModeRestricted || !slices.Equal(got.Allow, []string{"a.example.com"}) || len(got.Deny) != 2 {
		t.Errorf("a policy above the ceiling: %+v clamped %t", got, clamped)
	}
	if _, err := Compile(got); err != nil {
		t.Error(err)
	}
	if got, clamped := (Ceiling{}).Clamp(Policy{Mode: ModeOpen}); clamped || got.Mode != ModeOpen || len(got.Deny) != 0 {
		t.Errorf("zero ceiling: %+v %t", got, clamped)
	}
}
