package lease

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/distribution/reference"
)

// Defaults of the request bounds in Config.
const (
	// DefaultMaxEnvBytes is the default of Config.MaxEnvBytes.
	DefaultMaxEnvBytes = 64 << 10
	// MaxReasonLen bounds a release or reap reason; longer ones are cut.
	MaxReasonLen = 512
	// MaxTransitions bounds the transitions a lease record keeps: the most
	// recent ones; older ones are dropped and counted in
	// Lease.TransitionsDropped. 64 holds a lease's creation and a long
	// run of pauses, resumes and restarts (the restart budget looks back
	// at most 2×RestartConfig.Limit transitions) while a record stays a few KiB.
	MaxTransitions = 64
)

// AllowAllImages as an entry of Config.AllowedImages allows every image.
const AllowAllImages = "*"

// convKey is the conversation index key: conversations are per owner, so two
// owners' identical conversation ids are two independent leases. Neither
// part may contain NUL (control characters are refused), so the key is
// unambiguous.
func convKey(owner, conversationID string) string {
	return owner + "\x00" + conversationID
}

// SanitizeText makes caller-supplied free text safe to store and print: it
// replaces invalid UTF-8 and drops control and format characters (escape
// sequences, bidi overrides) except that tabs and newlines become spaces,
// trims it, and cuts it to at most max bytes on a rune boundary.
func SanitizeText(s string, max int) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			r = ' '
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			continue
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// imageAllowed reports whether the (normalized, familiar) image reference
// ref matches an entry of allowed: "*" matches everything; an entry ending
// in "/" matches every repository under it; any other entry matches that
// repository with any tag or digest (and itself exactly).
func imageAllowed(ref string, allowed []string) bool {
	for _, a := range allowed {
		switch {
		case a == AllowAllImages:
			return true
		case strings.HasSuffix(a, "/"):
			if strings.HasPrefix(ref, a) {
				return true
			}
		case ref == a:
			return true
		case strings.HasPrefix(ref, a) && strings.ContainsRune(":@", rune(ref[len(a)])):
			return true
		}
	}
	return false
}

// familiarImage parses an image reference and returns its short form
// ("berth/base:latest" → "berth/base:latest", "docker.io/library/debian" →
// "debian"), or an InvalidArgument naming the image field.
func familiarImage(image string) (string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", errdefs.InvalidArgument("image", "%q is not an image reference: %v", image, err)
	}
	return reference.FamiliarString(named), nil
}

// CheckImage validates an image reference and applies Config.AllowedImages
// as Acquire does (errdefs.ErrInvalidArgument or ErrPermissionDenied, both
// naming image), for edges that look an image up before acquiring it.
func (m *Manager) CheckImage(image string) error { return m.checkImage(image) }

// checkImage validates req's image and applies the allowlist. The default
// image is always allowed.
func (m *Manager) checkImage(image string) error {
	if len(image) > MaxImageLen {
		return errdefs.InvalidArgument("image", "%d bytes, at most %d", len(image), MaxImageLen)
	}
	fam, err := familiarImage(image)
	if err != nil {
		return err
	}
	if len(m.cfg.AllowedImages) == 0 || image == m.cfg.DefaultImage {
		return nil
	}
	if def, err := familiarImage(m.cfg.DefaultImage); err == nil && (fam == def || strings.TrimSuffix(fam, ":latest") == def) {
		return nil
	}
	if imageAllowed(fam, m.cfg.AllowedImages) {
		return nil
	}
	return fmt.Errorf("%w: image: %q is not allowed on this orchestrator (allowed: %s and the default image %s)",
		errdefs.ErrPermissionDenied, image, strings.Join(m.cfg.AllowedImages, ", "), m.cfg.DefaultImage)
}

// checkMaxResources rejects resources above Config.MaxResources (after
// defaults were applied). A zero maximum is no bound.
func (m *Manager) checkMaxResources(field string, r runtime.Resources) error {
	mx := m.cfg.MaxResources
	switch {
	case mx.NanoCPUs > 0 && r.NanoCPUs > mx.NanoCPUs:
		return errdefs.InvalidArgument(field+".cpus", "%g exceeds the maximum %g", float64(r.NanoCPUs)/1e9, float64(mx.NanoCPUs)/1e9)
	case mx.MemoryBytes > 0 && r.MemoryBytes > mx.MemoryBytes:
		return errdefs.InvalidArgument(field+".memory_bytes", "%d exceeds the maximum %d", r.MemoryBytes, mx.MemoryBytes)
	case mx.PidsLimit > 0 && r.PidsLimit > mx.PidsLimit:
		return errdefs.InvalidArgument(field+".pids", "%d exceeds the maximum %d", r.PidsLimit, mx.PidsLimit)
	case mx.DiskBytes > 0 && r.DiskBytes > mx.DiskBytes:
		return errdefs.InvalidArgument(field+".disk_bytes", "%d exceeds the maximum %d", r.DiskBytes, mx.DiskBytes)
	}
	return nil
}

// envBytes is the size an environment takes: every "KEY=VALUE\x00".
func envBytes(env map[string]string) int {
	n := 0
	for k, v := range env {
		n += len(k) + len(v) + 2
	}
	return n
}

// ownerLiveLocked counts owner's live leases. Called with mu held.
func (m *Manager) ownerLiveLocked(owner string) int { return m.liveByOwner[owner] }

// trackLiveLocked keeps liveByOwner in step with a state change of e from
// from to to. Called with mu held.
func (m *Manager) trackLiveLocked(owner string, from, to State) {
	switch {
	case !from.Live() && to.Live():
		m.liveByOwner[owner]++
	case from.Live() && !to.Live():
		if m.liveByOwner[owner]--; m.liveByOwner[owner] <= 0 {
			delete(m.liveByOwner, owner)
		}
	}
}

// droppable reports whether e is an ended, cleaned record with no work in
// flight, which may be purged. Called with mu held.
func (e *entry) droppable() bool {
	return e.l.State.Ended() && e.l.Cleaned && e.cleaning == nil && !e.queued
}

// excessEndedLocked returns the ids of droppable ended records beyond the
// newest Config.MaxEndedPerOwner of each owner. Called with mu held.
func (m *Manager) excessEndedLocked() []string {
	if m.cfg.MaxEndedPerOwner <= 0 {
		return nil
	}
	byOwner := map[string][]*entry{}
	for _, e := range m.leases {
		if e.droppable() {
			byOwner[e.l.Owner] = append(byOwner[e.l.Owner], e)
		}
	}
	var out []string
	for _, es := range byOwner {
		if len(es) <= m.cfg.MaxEndedPerOwner {
			continue
		}
		slices.SortFunc(es, func(a, b *entry) int {
			if c := b.l.EndedAt.Compare(a.l.EndedAt); c != 0 {
				return c
			}
			return strings.Compare(b.l.ID, a.l.ID)
		})
		for _, e := range es[m.cfg.MaxEndedPerOwner:] {
			out = append(out, e.l.ID)
		}
	}
	return out
}
