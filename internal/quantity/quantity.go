// Package quantity parses and formats the human quantities of the command
// line and configuration: byte sizes ("2Gi", "512Mi", "10G", "1048576") and
// CPU counts ("1.5", "500m"), in the notation Kubernetes and Docker users
// know. A plain integer is a number of bytes, so values written before
// suffixes existed keep their meaning. Bytes and CPUs implement the
// pflag.Value interface (String, Set, Type) without importing pflag.
package quantity

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// unit is one suffix and the number of bytes it stands for.
type unit struct {
	suffix string
	factor float64
}

// units are tried in order, so the longer binary suffixes come before the
// decimal ones they end with ("Ki" before "K" would not matter, but "KiB"
// before "Ki" does).
var units = []unit{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"PiB", 1 << 50}, {"EiB", 1 << 60},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}, {"Pi", 1 << 50}, {"Ei", 1 << 60},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"PB", 1e15}, {"EB", 1e18},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"P", 1e15}, {"E", 1e18},
	{"B", 1},
}

// ParseBytes parses a byte size: a plain integer (bytes), or a number,
// possibly with a fraction, followed by a binary suffix (Ki, Mi, Gi, Ti, Pi,
// Ei, optionally with a trailing B) or a decimal one (k/K, M, G, T, P, E,
// optionally with a trailing B). Fractions are rounded up to a whole byte.
// Negative sizes, unknown suffixes and sizes beyond int64 are errors.
func ParseBytes(s string) (int64, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, errors.New("empty size")
	}
	if n, err := strconv.ParseInt(in, 10, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		return n, nil
	}
	num, factor := in, 1.0
	for _, u := range units {
		if strings.HasSuffix(in, u.suffix) {
			num, factor = strings.TrimSpace(strings.TrimSuffix(in, u.suffix)), u.factor
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" || strings.ContainsAny(num, "eEpPxX_") || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("size %q: want a number of bytes or a number with a unit (Ki, Mi, Gi, Ti, k, M, G, T), e.g. 2Gi", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	v := math.Ceil(f * factor)
	if v >= math.MaxInt64 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(v), nil
}

// FormatBytes writes n with the largest binary suffix that divides it
// exactly ("2Gi", "1536Mi", "1000"), so ParseBytes(FormatBytes(n)) == n.
func FormatBytes(n int64) string {
	suffixes := []string{"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
	i := -1
	for n != 0 && n%1024 == 0 && i < len(suffixes)-1 {
		n /= 1024
		i++
	}
	if i < 0 {
		return strconv.FormatInt(n, 10)
	}
	return strconv.FormatInt(n, 10) + suffixes[i]
}

// ParseCPUs parses a CPU count: a decimal number of CPUs ("1.5", "2") or
// millicpus ("500m"). Negative, NaN and infinite counts are errors.
func ParseCPUs(s string) (float64, error) {
	in := strings.TrimSpace(s)
	factor := 1.0
	if m, ok := strings.CutSuffix(in, "m"); ok {
		in, factor = m, 1e-3
	}
	f, err := strconv.ParseFloat(in, 64)
	if err != nil || strings.ContainsAny(in, "eEpPxX_") || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("cpus %q: want a number of CPUs (1.5) or millicpus (500m)", s)
	}
	if f < 0 {
		return 0, fmt.Errorf("cpus %q is negative", s)
	}
	return f * factor, nil
}

// Bytes is a byte size usable as a command-line flag value (pflag.Value).
type Bytes int64

// String returns the size as FormatBytes writes it, or "0".
func (b *Bytes) String() string { return FormatBytes(int64(*b)) }

// Set parses v with ParseBytes.
func (b *Bytes) Set(v string) error {
	n, err := ParseBytes(v)
	if err != nil {
		return err
	}
	*b = Bytes(n)
	return nil
}

// Type names the value in help output.
func (b *Bytes) Type() string { return "bytes" }

// CPUs is a CPU count usable as a command-line flag value (pflag.Value).
type CPUs float64

// String returns the count as a decimal number.
func (c *CPUs) String() string { return strconv.FormatFloat(float64(*c), 'f', -1, 64) }

// Set parses v with ParseCPUs.
func (c *CPUs) Set(v string) error {
	f, err := ParseCPUs(v)
	if err != nil {
		return err
	}
	*c = CPUs(f)
	return nil
}

// Type names the value in help output.
func (c *CPUs) Type() string { return "cpus" }
