package runtime

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/distribution/reference"
)

// MaxLeaseIDLen bounds Spec.LeaseID.
const MaxLeaseIDLen = 128

// MaxUserLen bounds Spec.User.
const MaxUserLen = 65

// userRE matches a user spec: a user and an optional group, each a name
// (as useradd accepts them) or a number.
var userRE = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9_.-]*\$?(:[a-zA-Z0-9_][a-zA-Z0-9_.-]*\$?)?$`)

// ValidUser reports whether s is an acceptable Spec.User ("" included).
func ValidUser(s string) bool { return s == "" || (len(s) <= MaxUserLen && userRE.MatchString(s)) }

var (
	leaseIDRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)
	// ImageIDRE matches an image id (with or without "sha256:"), which is
	// accepted wherever an image reference is.
	ImageIDRE = regexp.MustCompile(`^(sha256:)?[a-f0-9]{12,64}$`)
)

// Validate checks the fields every backend's Create relies on; the error is
// errdefs.ErrInvalidArgument naming the bad field.
func (s Spec) Validate() error {
	switch {
	case s.LeaseID == "":
		return errdefs.InvalidArgument("lease_id", "is required")
	case len(s.LeaseID) > MaxLeaseIDLen:
		return errdefs.InvalidArgument("lease_id", "longer than %d characters", MaxLeaseIDLen)
	case !leaseIDRE.MatchString(s.LeaseID):
		return errdefs.InvalidArgument("lease_id", "%q: use letters, digits, '_', '.' and '-', starting with a letter or digit", s.LeaseID)
	case s.Image == "":
		return errdefs.InvalidArgument("image", "is required")
	case s.AgentToken == "":
		return errdefs.InvalidArgument("agent_token", "is required")
	case strings.IndexFunc(s.AgentToken, unicode.IsSpace) >= 0:
		return errdefs.InvalidArgument("agent_token", "must not contain whitespace")
	case s.ReadyTimeout < 0:
		return errdefs.InvalidArgument("ready_timeout", "must not be negative")
	case len(s.User) > MaxUserLen:
		return errdefs.InvalidArgument("user", "longer than %d characters", MaxUserLen)
	case s.User != "" && !userRE.MatchString(s.User):
		return errdefs.InvalidArgument("user", "%q: want NAME, UID, NAME:GROUP or UID:GID (letters, digits, '_', '.', '-', '$')", s.User)
	}
	if !ImageIDRE.MatchString(s.Image) {
		if _, err := reference.ParseNormalizedNamed(s.Image); err != nil {
			return errdefs.InvalidArgument("image", "%q is not a valid image reference: %v", s.Image, err)
		}
	}
	for k, v := range s.Secrets {
		if _, ok := s.Env[k]; ok || strings.Contains(k, ",") {
			return errdefs.InvalidArgument("secrets", "%s: a secret's name may not contain ',' nor also be in env", k)
		}
		if err := validEnvVar("secrets", k, v); err != nil {
			return err
		}
	}
	for k, v := range s.Env {
		if err := validEnvVar("env", k, v); err != nil {
			return err
		}
	}
	for k := range s.Labels {
		if k == "" || strings.ContainsAny(k, "=\"\x00") {
			return errdefs.InvalidArgument("labels", "invalid label key %q", k)
		}
	}
	if err := s.App.validate(); err != nil {
		return err
	}
	if s.WorkDir != "" && (!strings.HasPrefix(s.WorkDir, "/") || strings.ContainsFunc(s.WorkDir, unicode.IsControl)) {
		return errdefs.InvalidArgument("working_dir", "%q is not an absolute path", s.WorkDir)
	}
	if err := ValidateMounts("mounts", s.Mounts); err != nil {
		return err
	}
	return s.Resources.Validate("resources")
}

// validate checks an app (nil is none).
func (a *App) validate() error {
	if a == nil {
		return nil
	}
	switch {
	case len(a.Command) == 0 || a.Command[0] == "":
		return errdefs.InvalidArgument("app.command", "required")
	case a.Port < 1 || a.Port > 65535 || a.Port == AgentPort:
		return errdefs.InvalidArgument("app.port", "%d: want 1-65535, not the agent's %d", a.Port, AgentPort)
	case a.WorkDir != "" && !strings.HasPrefix(a.WorkDir, "/"):
		return errdefs.InvalidArgument("app.working_dir", "%q is not absolute", a.WorkDir)
	case strings.ContainsRune(a.WorkDir, 0) || strings.ContainsFunc(a.Key, unicode.IsSpace):
		return errdefs.InvalidArgument("app", "working_dir contains NUL or key contains whitespace")
	}
	for _, arg := range a.Command {
		if strings.ContainsRune(arg, 0) {
			return errdefs.InvalidArgument("app.command", "an argument contains a NUL byte")
		}
	}
	return nil
}

// validEnvVar checks one variable of field (env or secrets).
func validEnvVar(field, k, v string) error {
	switch {
	case k == "" || strings.ContainsAny(k, "=\x00"):
		return errdefs.InvalidArgument(field, "invalid variable name %q", k)
	case strings.HasPrefix(k, AgentEnvPrefix):
		return errdefs.InvalidArgument(field, "%s: the %s prefix is reserved for the agent", k, AgentEnvPrefix)
	case strings.ContainsRune(v, 0):
		return errdefs.InvalidArgument(field, "%s: value contains a NUL byte", k)
	}
	return nil
}

// Environ returns the variables a backend adds to the image's environment:
// Env, Secrets, AgentSecretsEnv naming the secrets (sorted) when there
// are any, and AgentAppKeyEnv with the app's key when there is one.
func (s Spec) Environ() map[string]string {
	env := make(map[string]string, len(s.Env)+len(s.Secrets)+1)
	maps.Copy(env, s.Env)
	maps.Copy(env, s.Secrets)
	if len(s.Secrets) > 0 {
		env[AgentSecretsEnv] = strings.Join(slices.Sorted(maps.Keys(s.Secrets)), ",")
	}
	if s.App != nil && s.App.Key != "" {
		env[AgentAppKeyEnv] = s.App.Key
	}
	return env
}
