package lease

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/distribution/reference"
)

// Defaults of the request bounds in Config.
const (
	// DefaultMaxEnvBytes is the default of AdmissionConfig.MaxEnvBytes.
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

// AllowAllImages as an entry of AdmissionConfig.AllowedImages allows
// every image.
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

// AdmissionConfig configures admission (limits.go): what an acquire may
// ask for — its image, user, resources and the sizes of its fields — and
// how many live leases, and ended records, there may be. Zero fields take
// the defaults (DefaultAdmissionConfig).
type AdmissionConfig struct {
	// MaxLive bounds live (PENDING, READY, PAUSED, RELEASING) leases; an
	// acquire beyond it fails with errdefs.ErrResourceExhausted and a
	// RetryAfter hint. Default 100; negative means no limit.
	MaxLive int
	// MaxLivePerOwner bounds one owner's live leases; an acquire beyond it
	// fails like MaxLive (errdefs.ErrResourceExhausted with a RetryAfter
	// hint) unless AcquireRequest.NoOwnerLimit is set. Default 0 (or
	// negative): no per-owner limit.
	MaxLivePerOwner int
	// MaxEndedPerOwner bounds the ended lease records kept per owner: the
	// reaper purges the oldest beyond it even before Config.Retention
	// passes. Default 0 (or negative): no bound (Retention alone).
	MaxEndedPerOwner int
	// DefaultResources fill the zero fields of an acquire's resources.
	// Default zero: the runtime's defaults.
	DefaultResources runtime.Resources
	// MaxResources bounds an acquire's resources (after defaults) field by
	// field; above it is errdefs.ErrInvalidArgument naming the field
	// ("resources.cpus: 4096 exceeds the maximum 4"). A zero field is no
	// bound. Default zero (the orchestrator sets its own maximums).
	MaxResources runtime.Resources
	// MaxEnvBytes bounds the total size of an acquire's env and secrets
	// (every KEY=VALUE plus a separator). Default DefaultMaxEnvBytes
	// (64 KiB); negative takes the default too.
	MaxEnvBytes int
	// MaxLabels bounds the number of labels of an acquire. Default
	// MaxLabels (64); negative takes the default too.
	MaxLabels int
	// MaxPublicPorts bounds an acquire's public ports. Default
	// MaxPublicPorts (16); negative takes the default too.
	MaxPublicPorts int
	// AllowedImages are the images an acquire may name: "*" allows every
	// image, an entry ending in "/" every repository under that prefix,
	// any other entry that repository with any tag or digest (references
	// are compared in their short form: "berth/base", not
	// "docker.io/berth/base"). Config.DefaultImage is always allowed.
	// Another image is errdefs.ErrPermissionDenied naming the image
	// field. Default empty: every image (the orchestrator passes its
	// allowlist).
	AllowedImages []string
	// DefaultUser is the user commands run as in sandboxes of images that
	// match DefaultUserImages when an acquire names none; other images run
	// commands as their own configured user. Default "": the image's user
	// everywhere (the orchestrator sets "sandbox").
	DefaultUser string
	// DefaultUserImages are the image prefixes (familiar form, e.g.
	// "berth/"; "*" for all) DefaultUser applies to. Default
	// DefaultUserImages (["berth/"]): berth's images carry the user.
	DefaultUserImages []string
	// DenyRootUser forbids commands as root: an acquire naming a root user
	// is errdefs.ErrPermissionDenied, and the agent refuses uid 0
	// (PERMISSION_DENIED) whatever a command asks for. Default false.
	DenyRootUser bool
}

// DefaultAdmissionConfig returns the defaults of AdmissionConfig: at most
// 100 live leases, DefaultMaxEnvBytes of env, MaxLabels labels and
// MaxPublicPorts public ports per acquire, DefaultUser applying to
// DefaultUserImages; no per-owner limits, resource defaults or bounds,
// image allowlist, default user, nor root ban.
func DefaultAdmissionConfig() AdmissionConfig {
	return AdmissionConfig{
		MaxLive:           100,
		MaxEnvBytes:       DefaultMaxEnvBytes,
		MaxLabels:         MaxLabels,
		MaxPublicPorts:    MaxPublicPorts,
		DefaultUserImages: slices.Clone(DefaultUserImages),
	}
}

// withDefaults returns c with its zero fields (and a negative MaxEnvBytes,
// MaxLabels or MaxPublicPorts) taken from DefaultAdmissionConfig,
// validated.
func (c AdmissionConfig) withDefaults() (AdmissionConfig, error) {
	d := DefaultAdmissionConfig()
	if c.MaxLive == 0 {
		c.MaxLive = d.MaxLive
	}
	if c.MaxEnvBytes <= 0 {
		c.MaxEnvBytes = d.MaxEnvBytes
	}
	if c.MaxLabels <= 0 {
		c.MaxLabels = d.MaxLabels
	}
	if c.MaxPublicPorts <= 0 {
		c.MaxPublicPorts = d.MaxPublicPorts
	}
	if len(c.DefaultUserImages) == 0 {
		c.DefaultUserImages = d.DefaultUserImages
	}
	return c, c.Validate()
}

// Validate reports the first field that cannot work (an
// errdefs.ErrInvalidArgument naming it): MaxEnvBytes, MaxLabels and
// MaxPublicPorts must be positive, and the resources valid (no negative
// field). A Config's zero fields are filled with the defaults before it is
// checked; a caller without defaults (the orchestrator's configuration)
// checks its own values as they are.
func (c AdmissionConfig) Validate() error {
	switch {
	case c.MaxEnvBytes <= 0:
		return errdefs.InvalidArgument("max_env_bytes", "must be positive, got %d", c.MaxEnvBytes)
	case c.MaxLabels <= 0:
		return errdefs.InvalidArgument("max_labels", "must be positive, got %d", c.MaxLabels)
	case c.MaxPublicPorts <= 0:
		return errdefs.InvalidArgument("max_public_ports", "must be positive, got %d", c.MaxPublicPorts)
	}
	if err := validResources("max_resources", c.MaxResources); err != nil {
		return err
	}
	return validResources("default_resources", c.DefaultResources)
}

// admissionHost is what admission needs from the Manager; *Manager
// implements it.
type admissionHost interface {
	// now is the lease clock (manager.go).
	now() time.Time
}

// admission applies AdmissionConfig: it checks what an acquire asks for
// (validate in acquire.go calls it) and counts the live leases, per owner
// too, refusing one beyond the limits. Its state (liveByOwner) and the
// Manager's maps it reads are guarded by the Manager's mu.
type admission struct {
	cfg AdmissionConfig
	// defaultImage is Config.DefaultImage, always allowed.
	defaultImage string
	host         admissionHost
	leases       map[string]*entry // the Manager's, read with mu held
	counts       map[State]int     // the Manager's records by state, read with mu held
	// liveByOwner counts live (PENDING, READY, PAUSED, RELEASING) leases
	// per owner.
	liveByOwner map[string]int
}

// newAdmission returns the admission of cfg for the Manager host, whose
// leases and counts maps (guarded by its mu) it reads.
func newAdmission(cfg Config, host admissionHost, leases map[string]*entry, counts map[State]int) *admission {
	return &admission{cfg: cfg.Admission, defaultImage: cfg.DefaultImage, host: host, leases: leases, counts: counts,
		liveByOwner: map[string]int{}}
}

// liveCountLocked counts the live leases (PENDING, READY, PAUSED,
// RELEASING). Called with the Manager's mu held.
func (a *admission) liveCountLocked() int {
	return a.counts[StatePending] + a.counts[StateReady] + a.counts[StatePaused] + a.counts[StateReleasing]
}

// CheckImage validates an image reference and applies
// AdmissionConfig.AllowedImages as Acquire does
// (errdefs.ErrInvalidArgument or ErrPermissionDenied, both naming image),
// for edges that look an image up before acquiring it.
func (m *Manager) CheckImage(image string) error { return m.admit.checkImage(image) }

// checkImage validates req's image and applies the allowlist. The default
// image is always allowed.
func (a *admission) checkImage(image string) error {
	if len(image) > MaxImageLen {
		return errdefs.InvalidArgument("image", "%d bytes, at most %d", len(image), MaxImageLen)
	}
	fam, err := familiarImage(image)
	if err != nil {
		return err
	}
	if len(a.cfg.AllowedImages) == 0 || image == a.defaultImage {
		return nil
	}
	if def, err := familiarImage(a.defaultImage); err == nil && (fam == def || strings.TrimSuffix(fam, ":latest") == def) {
		return nil
	}
	if imageAllowed(fam, a.cfg.AllowedImages) {
		return nil
	}
	return fmt.Errorf("%w: image: %q is not allowed on this orchestrator (allowed: %s and the default image %s)",
		errdefs.ErrPermissionDenied, image, strings.Join(a.cfg.AllowedImages, ", "), a.defaultImage)
}

// checkSizes applies the bounds on the sizes of req's labels, and of its
// env and secrets together.
func (a *admission) checkSizes(req AcquireRequest) error {
	if err := validLabels("labels", req.Labels, a.cfg.MaxLabels); err != nil {
		return err
	}
	if n := len(req.Env) + len(req.Secrets); n > MaxEnv {
		return errdefs.InvalidArgument("env", "%d variables, at most %d", n, MaxEnv)
	}
	if n := envBytes(req.Env) + envBytes(req.Secrets); n > a.cfg.MaxEnvBytes {
		return errdefs.InvalidArgument("env", "%d bytes in total, at most %d", n, a.cfg.MaxEnvBytes)
	}
	return nil
}

// checkPublicPorts applies the bound on the number of req's public ports.
func (a *admission) checkPublicPorts(req AcquireRequest) error {
	if len(req.PublicPorts) > a.cfg.MaxPublicPorts {
		return errdefs.InvalidArgument("public_ports", "%d ports, at most %d", len(req.PublicPorts), a.cfg.MaxPublicPorts)
	}
	return nil
}

// resources returns r with AdmissionConfig.DefaultResources filling its
// zero fields, or an errdefs.ErrInvalidArgument naming field.* when the
// result is above AdmissionConfig.MaxResources.
func (a *admission) resources(field string, r runtime.Resources) (runtime.Resources, error) {
	r = r.WithDefaults(a.cfg.DefaultResources)
	return r, a.checkMaxResources(field, r)
}

// checkMaxResources rejects resources above AdmissionConfig.MaxResources
// (after defaults were applied). A zero maximum is no bound.
func (a *admission) checkMaxResources(field string, r runtime.Resources) error {
	mx := a.cfg.MaxResources
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
func (a *admission) ownerLiveLocked(owner string) int { return a.liveByOwner[owner] }

// trackLiveLocked keeps liveByOwner in step with a state change of a lease
// of owner from from to to. Called with mu held.
func (a *admission) trackLiveLocked(owner string, from, to State) {
	switch {
	case !from.Live() && to.Live():
		a.liveByOwner[owner]++
	case from.Live() && !to.Live():
		if a.liveByOwner[owner]--; a.liveByOwner[owner] <= 0 {
			delete(a.liveByOwner, owner)
		}
	}
}

// checkLiveLimitsLocked refuses a new lease for req when
// AdmissionConfig.MaxLive leases, or MaxLivePerOwner leases of req.Owner,
// are live, with a RetryAfterError. Called with mu held.
func (a *admission) checkLiveLimitsLocked(req AcquireRequest) error {
	if a.cfg.MaxLive >= 0 && a.liveCountLocked() >= a.cfg.MaxLive {
		after := a.retryHintLocked()
		return &RetryAfterError{
			Err:   errdefs.ResourceExhausted("%d live leases, the maximum is %d; retry after %s", a.liveCountLocked(), a.cfg.MaxLive, after),
			After: after,
		}
	}
	if a.cfg.MaxLivePerOwner > 0 && !req.NoOwnerLimit && a.ownerLiveLocked(req.Owner) >= a.cfg.MaxLivePerOwner {
		after := a.retryHintForLocked(func(l *Lease) bool { return l.Owner == req.Owner })
		return &RetryAfterError{
			Err:   errdefs.ResourceExhausted("owner %q has %d live leases, the maximum per owner is %d; retry after %s", req.Owner, a.ownerLiveLocked(req.Owner), a.cfg.MaxLivePerOwner, after),
			After: after,
		}
	}
	return nil
}

// retryHintLocked estimates when a live slot frees up: soon if a lease is
// being released, else when the first READY lease expires; between 1s and 30s.
func (a *admission) retryHintLocked() time.Duration {
	if a.counts[StateReleasing] > 0 {
		return time.Second
	}
	return a.retryHintForLocked(func(*Lease) bool { return true })
}

// retryHintForLocked is retryHintLocked over the leases that match: soon if
// one is being released, else when the first READY one expires; between 1s
// and 30s.
func (a *admission) retryHintForLocked(match func(*Lease) bool) time.Duration {
	const lo, hi = time.Second, 30 * time.Second
	now := a.host.now()
	best := hi
	for _, e := range a.leases {
		if !match(&e.l) {
			continue
		}
		if e.l.State == StateReleasing {
			return lo
		}
		if e.l.State != StateReady {
			continue
		}
		d := e.l.ExpiresAt.Sub(now)
		if e.l.IdleTimeout > 0 {
			d = min(d, e.l.LastActivityAt.Add(e.l.IdleTimeout).Sub(now))
		}
		best = min(best, d)
	}
	return max(lo, best.Round(time.Second))
}

// droppable reports whether e is an ended, cleaned record that no
// operation holds, which may be purged. Called with mu held.
func (e *entry) droppable() bool {
	return e.l.State.Ended() && e.l.Cleaned && e.op == nil
}

// excessEndedLocked returns the ids of droppable ended records beyond the
// newest AdmissionConfig.MaxEndedPerOwner of each owner. Called with mu
// held.
func (a *admission) excessEndedLocked() []string {
	if a.cfg.MaxEndedPerOwner <= 0 {
		return nil
	}
	byOwner := map[string][]*entry{}
	for _, e := range a.leases {
		if e.droppable() {
			byOwner[e.l.Owner] = append(byOwner[e.l.Owner], e)
		}
	}
	var out []string
	for _, es := range byOwner {
		if len(es) <= a.cfg.MaxEndedPerOwner {
			continue
		}
		slices.SortFunc(es, func(a, b *entry) int {
			if c := b.l.EndedAt.Compare(a.l.EndedAt); c != 0 {
				return c
			}
			return strings.Compare(b.l.ID, a.l.ID)
		})
		for _, e := range es[a.cfg.MaxEndedPerOwner:] {
			out = append(out, e.l.ID)
		}
	}
	return out
}
