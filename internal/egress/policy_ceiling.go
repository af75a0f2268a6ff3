package egress

import (
	"fmt"
	"slices"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Ceiling is the operator's bound on every sandbox's policy: clients may
// ask for less, never for more (docs/network-policy.md, "Operator
// ceiling"). The zero Ceiling bounds nothing.
type Ceiling struct {
	// MaxMode is the widest mode a policy may have: none < restricted <
	// open. "" means open.
	MaxMode Mode
	// AlwaysDeny is added to every policy's deny list when it is enforced;
	// no client sees or removes it (same entry forms as Policy.Deny).
	AlwaysDeny []string
	// AllowCeiling, when set, bounds restricted policies' allow lists:
	// each entry must be covered by one of these (a CIDR inside a ceiling
	// CIDR, a name equal to a ceiling name or under a ceiling *.suffix; a
	// ceiling entry with a port covers that port only). It needs MaxMode
	// restricted.
	AllowCeiling []string
}

// modeRank orders modes by what they let through.
func modeRank(m Mode) int {
	switch m {
	case ModeNone:
		return 0
	case ModeRestricted:
		return 1
	default:
		return 2
	}
}

// Bounded reports whether c restricts anything.
func (c Ceiling) Bounded() bool {
	return modeRank(c.MaxMode) < 2 || len(c.AlwaysDeny) > 0 || len(c.AllowCeiling) > 0
}

// Validate checks the operator's settings; errors name the setting
// (max-network-mode, network-always-deny[i], network-allow-ceiling[i]).
func (c Ceiling) Validate() error {
	switch c.MaxMode {
	case "", ModeOpen, ModeRestricted, ModeNone:
	default:
		return fmt.Errorf("max-network-mode %q: want none, restricted or open", string(c.MaxMode))
	}
	if _, err := parseList("network-always-deny", c.AlwaysDeny); err != nil {
		return trimCategory(err)
	}
	if _, err := parseList("network-allow-ceiling", c.AllowCeiling); err != nil {
		return trimCategory(err)
	}
	if len(c.AllowCeiling) > 0 && c.MaxMode != ModeRestricted {
		return fmt.Errorf("network-allow-ceiling needs max-network-mode restricted (got %q): with open a sandbox reaches everything anyway, with none nothing", c.mode())
	}
	return nil
}

// trimCategory drops errdefs' category prefix from a settings error.
func trimCategory(err error) error {
	return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), errdefs.ErrInvalidArgument.Error()+": "))
}

func (c Ceiling) mode() Mode {
	if c.MaxMode == "" {
		return ModeOpen
	}
	return c.MaxMode
}

// Check reports whether policy p (as a client asks for it) stays under
// c: errdefs.ErrPermissionDenied naming the field (network.mode,
// network.allow[i]) and the ceiling, errdefs.ErrInvalidArgument for a
// malformed p.
func (c Ceiling) Check(p Policy) error {
	cp, err := Compile(p)
	if err != nil {
		return err
	}
	if modeRank(cp.Mode) > modeRank(c.mode()) {
		return errdefs.PermissionDenied("network.mode: %q exceeds the operator's ceiling (max-network-mode %s)", string(cp.Mode), c.mode())
	}
	if cp.Mode != ModeRestricted || len(c.AllowCeiling) == 0 {
		return nil
	}
	ceil, err := parseList("network-allow-ceiling", c.AllowCeiling)
	if err != nil {
		return err
	}
	for i, e := range cp.Allow {
		if !coveredBy(e, ceil) {
			return errdefs.PermissionDenied("network.allow[%d]: %q is outside the operator's ceiling (network-allow-ceiling %s)", i, e.String(), strings.Join(c.AllowCeiling, ","))
		}
	}
	return nil
}

// Clamp returns the policy to enforce for p: its mode lowered to MaxMode,
// in restricted mode its allow entries outside AllowCeiling dropped, and
// AlwaysDeny added to its deny list. A policy Check accepted only gains
// AlwaysDeny; the rest matters for policies recorded before the operator
// lowered the ceiling. clamped reports whether more than AlwaysDeny
// changed.
func (c Ceiling) Clamp(p Policy) (out Policy, clamped bool) {
	out = Policy{Mode: p.Mode, Allow: slices.Clone(p.Allow), Deny: slices.Clone(p.Deny)}
	if out.Mode == "" {
		out.Mode = ModeOpen
	}
	if modeRank(out.Mode) > modeRank(c.mode()) {
		out.Mode, clamped = c.mode(), true
	}
	if out.Mode == ModeRestricted && len(c.AllowCeiling) > 0 {
		ceil, _ := parseList("network-allow-ceiling", c.AllowCeiling)
		out.Allow = slices.DeleteFunc(out.Allow, func(s string) bool {
			e, err := ParseEntry(s)
			if err != nil || !coveredBy(e, ceil) {
				clamped = true
				return true
			}
			return false
		})
	}
	for _, d := range c.AlwaysDeny {
		if !slices.Contains(out.Deny, d) {
			out.Deny = append(out.Deny, d)
		}
	}
	return out, clamped
}

// coveredBy reports whether some entry of ceil covers e.
func coveredBy(e Entry, ceil []Entry) bool {
	return slices.ContainsFunc(ceil, func(c Entry) bool { return covers(c, e) })
}

// covers reports whether ceiling entry c lets through everything e does.
func covers(c, e Entry) bool {
	if c.Port != 0 && c.Port != e.Port {
		return false
	}
	switch {
	case c.Prefix.IsValid() && e.Prefix.IsValid():
		return c.Prefix.Bits() <= e.Prefix.Bits() && c.Prefix.Contains(e.Prefix.Addr())
	case c.Domain != "" && e.Domain != "":
		if !c.Wildcard {
			return !e.Wildcard && e.Domain == c.Domain
		}
		return e.Domain == c.Domain && e.Wildcard || strings.HasSuffix(e.Domain, "."+c.Domain)
	}
	// A name is not bounded by a CIDR (it may resolve anywhere), nor an
	// address by a name.
	return false
}
