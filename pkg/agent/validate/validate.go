// Package validate checks the fields of agent requests. Every failure is an
// errdefs.ErrInvalidArgument whose message names the field, so the edge can
// answer INVALID_ARGUMENT / HTTP 400 with something a caller can act on.
package validate

import (
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Limits on request fields.
const (
	// MaxPathLen is the longest path accepted (Linux PATH_MAX).
	MaxPathLen = 4096
	// MaxArgs is the most argv entries accepted.
	MaxArgs = 4096
	// MaxArgLen is the longest single argument or shell line accepted.
	MaxArgLen = 128 << 10
	// MaxEnv is the most environment entries accepted.
	MaxEnv = 1024
	// MaxStdin is the most stdin bytes accepted inline in one request.
	MaxStdin = 16 << 20
)

// AbsPath checks that p is a non-empty absolute path without NUL bytes and
// returns it cleaned. field names the request field for the error.
func AbsPath(field, p string) (string, error) {
	if p == "" {
		return "", errdefs.InvalidArgument(field, "must not be empty")
	}
	if err := NoNUL(field, p); err != nil {
		return "", err
	}
	if len(p) > MaxPathLen {
		return "", errdefs.InvalidArgument(field, "longer than %d bytes", MaxPathLen)
	}
	if !filepath.IsAbs(p) {
		return "", errdefs.InvalidArgument(field, "must be an absolute path, got %q", p)
	}
	return filepath.Clean(p), nil
}

// OptionalAbsPath is AbsPath for a field that may be empty, in which case def
// is returned.
func OptionalAbsPath(field, p, def string) (string, error) {
	if p == "" {
		return def, nil
	}
	return AbsPath(field, p)
}

// NoNUL rejects strings with NUL bytes, which the kernel would truncate at.
func NoNUL(field, s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errdefs.InvalidArgument(field, "must not contain NUL bytes")
	}
	return nil
}

// Command checks a command given as argv or as a shell line: exactly one must
// be set, with no NUL bytes and within the size limits.
func Command(argv []string, shell string) error {
	switch {
	case len(argv) == 0 && shell == "":
		return errdefs.InvalidArgument("argv", "one of argv and command is required")
	case len(argv) > 0 && shell != "":
		return errdefs.InvalidArgument("argv", "set argv or command, not both")
	}
	if shell != "" {
		if strings.TrimSpace(shell) == "" {
			return errdefs.InvalidArgument("command", "must not be blank")
		}
		if len(shell) > MaxArgLen {
			return errdefs.InvalidArgument("command", "longer than %d bytes", MaxArgLen)
		}
		return NoNUL("command", shell)
	}
	if len(argv) > MaxArgs {
		return errdefs.InvalidArgument("argv", "more than %d entries", MaxArgs)
	}
	if argv[0] == "" {
		return errdefs.InvalidArgument("argv[0]", "must not be empty")
	}
	for i, a := range argv {
		if len(a) > MaxArgLen {
			return errdefs.InvalidArgument(indexed("argv", i), "longer than %d bytes", MaxArgLen)
		}
		if err := NoNUL(indexed("argv", i), a); err != nil {
			return err
		}
	}
	return nil
}

// Env checks environment entries: names non-empty, without '=' or NUL; values
// without NUL.
func Env(env map[string]string) error {
	if len(env) > MaxEnv {
		return errdefs.InvalidArgument("env", "more than %d entries", MaxEnv)
	}
	for k, v := range env {
		if k == "" {
			return errdefs.InvalidArgument("env", "empty variable name")
		}
		if strings.ContainsAny(k, "=\x00") {
			return errdefs.InvalidArgument("env", "variable name %q must not contain '=' or NUL", k)
		}
		if err := NoNUL("env."+k, v); err != nil {
			return err
		}
	}
	return nil
}

func indexed(field string, i int) string {
	return field + "[" + strconv.Itoa(i) + "]"
}
