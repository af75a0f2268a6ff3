package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/quantity"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// value is one setting's field of a Config, settable from text (a flag, an
// environment variable) and from JSON (the file). It is the setting's "how
// to parse it" column; String and Type serve --help and the docs.
type value interface {
	// Set parses text from a flag or an environment variable.
	Set(text string) error
	// setJSON parses the value of the setting's key in the file.
	setJSON(raw json.RawMessage) error
	// String formats the current value.
	String() string
	// Type names the kind of value in --help.
	Type() string
}

// strictJSON decodes raw into dst, refusing unknown object keys (as the
// whole file does).
func strictJSON(raw json.RawMessage, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}

// jsonText decodes a JSON string, for the values the file writes as text
// (durations, sizes).
func jsonText(raw json.RawMessage, what string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("want a string %s, got %s", what, raw)
	}
	return s, nil
}

// stringValue is a text setting.
type stringValue struct{ p *string }

func (v stringValue) Set(s string) error                { *v.p = s; return nil }
func (v stringValue) setJSON(raw json.RawMessage) error { return strictJSON(raw, v.p) }
func (v stringValue) String() string                    { return *v.p }
func (v stringValue) Type() string                      { return "string" }

// userValue is Admission.DefaultUser: "image" stands for "" (every image's own
// user), which an empty flag or variable cannot say.
type userValue struct{ stringValue }

func (v userValue) Set(s string) error {
	if s == "image" {
		s = ""
	}
	return v.stringValue.Set(s)
}

func (v userValue) setJSON(raw json.RawMessage) error {
	if err := v.stringValue.setJSON(raw); err != nil {
		return err
	}
	return v.Set(*v.p)
}

// listValue is a list of text: comma-separated in a flag or variable
// (blank entries dropped; the list replaces the default), an array of
// strings in the file.
type listValue struct{ p *[]string }

func (v listValue) Set(s string) error {
	var list []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			list = append(list, e)
		}
	}
	*v.p = list
	return nil
}
func (v listValue) setJSON(raw json.RawMessage) error { return strictJSON(raw, v.p) }
func (v listValue) String() string                    { return strings.Join(*v.p, ",") }
func (v listValue) Type() string                      { return "list" }

// boolValue is true or false. optional makes a bare flag mean true
// (--userns); otherwise the flag takes its value from the next argument as
// it always has (--allow-root-user false).
type boolValue struct {
	p        *bool
	optional bool
}

func (v boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*v.p = b
	return nil
}
func (v boolValue) setJSON(raw json.RawMessage) error { return strictJSON(raw, v.p) }
func (v boolValue) String() string                    { return strconv.FormatBool(*v.p) }

func (v boolValue) Type() string {
	if v.optional {
		return "bool" // pflag prints no value name for a bool
	}
	return "true|false"
}

// durationValue is a Go duration ("90s", "10m", "1h"), a string in the
// file too.
type durationValue struct{ p *orchestrator.Duration }

func (v durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration (like 30s, 10m, 1h)", s)
	}
	*v.p = orchestrator.Duration(d)
	return nil
}

func (v durationValue) setJSON(raw json.RawMessage) error {
	s, err := jsonText(raw, `duration like "10m"`)
	if err != nil {
		return err
	}
	return v.Set(s)
}

// String writes the duration as Go does, without trailing zero units
// ("24h", "2m", "1m30s").
func (v durationValue) String() string {
	s := time.Duration(*v.p).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (v durationValue) Type() string { return "duration" }

// integer is the field types of whole-number settings.
type integer interface{ ~int | ~int64 | ~uint32 }

// intValue is a whole number; with bytes set, a size that may also be
// written as a quantity ("512Mi", "10Gi", "2G"; a plain integer is bytes).
// The file takes a JSON number (or, for a size, a quantity string).
type intValue[T integer] struct {
	p     *T
	bytes bool
}

func (v intValue[T]) Set(s string) error {
	n, err := parseInt[T](s)
	if err != nil && v.bytes {
		if b, qerr := quantity.ParseBytes(s); qerr == nil {
			n, err = T(b), checkRange[T](b, s)
		} else if !errors.Is(err, errRange) {
			err = fmt.Errorf("%q is not a size (bytes, or a quantity like 512Mi, 10Gi, 2G)", s)
		}
	}
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

func (v intValue[T]) setJSON(raw json.RawMessage) error {
	if len(raw) == 0 || raw[0] != '"' {
		return strictJSON(raw, v.p)
	}
	if !v.bytes {
		return fmt.Errorf("want a number, got %s", raw)
	}
	s, err := jsonText(raw, "size")
	if err != nil {
		return err
	}
	return v.Set(s)
}

func (v intValue[T]) String() string {
	if v.bytes {
		return quantity.FormatBytes(int64(*v.p))
	}
	return strconv.FormatInt(int64(*v.p), 10)
}

func (v intValue[T]) Type() string {
	if v.bytes {
		return "bytes"
	}
	return "int"
}

// errRange marks a number too large (or negative) for its setting.
var errRange = errors.New("out of range")

// parseInt parses a decimal integer, or one with a base prefix (0x, 0o,
// 0b) as Go's flag package accepted, and checks that it fits T.
func parseInt[T integer](s string) (T, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		n, err = strconv.ParseInt(s, 0, 64)
	}
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q is %w", s, errRange)
		}
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return T(n), checkRange[T](n, s)
}

// checkRange reports an error when n does not fit T.
func checkRange[T integer](n int64, s string) error {
	if int64(T(n)) != n {
		return fmt.Errorf("%q is %w", s, errRange)
	}
	return nil
}

// cpusValue is a number of CPUs: a decimal ("1.5") or millicpus ("500m").
type cpusValue struct{ p *float64 }

func (v cpusValue) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		if f, err = quantity.ParseCPUs(s); err != nil {
			return fmt.Errorf("%q is not a number of CPUs (like 1.5 or 500m)", s)
		}
	}
	*v.p = f
	return nil
}
func (v cpusValue) setJSON(raw json.RawMessage) error { return strictJSON(raw, v.p) }
func (v cpusValue) String() string                    { return strconv.FormatFloat(*v.p, 'f', -1, 64) }
func (v cpusValue) Type() string                      { return "cpus" }

// clientsValue is the client tokens: "owner:token[,owner:token]" in the
// environment, which adds to the file's [{"owner": …, "token": …}].
type clientsValue struct{ p *[]orchestrator.Client }

// fileClient is one client in the file.
type fileClient struct {
	Owner string `json:"owner"`
	Token string `json:"token"`
}

func (v clientsValue) Set(s string) error {
	for _, pair := range strings.Split(s, ",") {
		owner, tok, ok := strings.Cut(strings.TrimSpace(pair), ":")
		if !ok || owner == "" || tok == "" {
			return errors.New("want owner:token[,owner:token]")
		}
		*v.p = append(*v.p, orchestrator.Client{Owner: owner, Token: tok})
	}
	return nil
}

func (v clientsValue) setJSON(raw json.RawMessage) error {
	var list []fileClient
	if err := strictJSON(raw, &list); err != nil {
		return err
	}
	*v.p = nil
	for _, c := range list {
		*v.p = append(*v.p, orchestrator.Client(c))
	}
	return nil
}

// String never shows a token.
func (v clientsValue) String() string { return "" }
func (v clientsValue) Type() string   { return "clients" }

// pairsValue maps names to values: NAME=VALUE, comma-separated in a flag
// or variable, adding to what is set (the flag may be repeated); an
// object of strings in the file.
type pairsValue struct{ p *map[string]string }

func (v pairsValue) Set(s string) error {
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		name, val, ok := strings.Cut(pair, "=")
		if name, val = strings.TrimSpace(name), strings.TrimSpace(val); !ok || name == "" || val == "" {
			return fmt.Errorf("%q: want NAME=VALUE[,NAME=VALUE]", pair)
		}
		if *v.p == nil {
			*v.p = map[string]string{}
		}
		(*v.p)[name] = val
	}
	return nil
}

func (v pairsValue) setJSON(raw json.RawMessage) error {
	var m map[string]string
	if err := strictJSON(raw, &m); err != nil {
		return err
	}
	*v.p = m
	return nil
}

func (v pairsValue) String() string {
	names := make([]string, 0, len(*v.p))
	for k := range *v.p {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, k := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + (*v.p)[k])
	}
	return b.String()
}

func (v pairsValue) Type() string { return "pairs" }

// repeatable marks pairsValue: every --e2b-template flag is applied.
func (pairsValue) repeatable() {}
