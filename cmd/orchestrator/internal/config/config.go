// Package config loads the orchestrator's configuration for `orchestrator
// serve`. One table (settings) gives every field of orchestrator.Config a
// flag, a BERTH_* environment variable and a key in the JSON file, with
// its help text and its parser; the sources apply in the order
//
//	defaults < file < environment < flags
//
// so a flag given explicitly wins even when it repeats the default. An
// empty environment variable, or an empty flag value, counts as not given
// (only the file can set a text to empty). Secrets have no flag: a
// command line is visible to every user of the host (ps).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/berth-dev/berth/pkg/orchestrator"
)

// EnvConfigFile names the JSON configuration file when --config does not.
const EnvConfigFile = "BERTH_CONFIG"

// groupAnnotation is the pflag annotation holding a flag's group.
const groupAnnotation = "berth_group"

// Flags are the serve flags registered on one FlagSet: what the command
// line said, kept until Load applies it over the file and the environment.
type Flags struct {
	file  string
	probe orchestrator.Config // checks flag text as it is parsed
	flags []*flagValue
}

// flagValue is the pflag.Value of one setting's flag.
type flagValue struct {
	setting *setting
	value   value // bound to Flags.probe
	text    string
	set     bool
	// texts are every text of a repeatable setting's flag (poolsValue),
	// each applied in turn.
	texts []string
}

// Set checks text and keeps it for Load. An empty text is no value: the
// flag counts as not given, as an empty variable does.
func (v *flagValue) Set(text string) error {
	if text == "" {
		v.text, v.set = "", false
		return nil
	}
	if err := v.value.Set(text); err != nil {
		return err
	}
	v.text, v.set = text, true
	if _, ok := v.value.(interface{ repeatable() }); ok {
		v.texts = append(v.texts, text)
	}
	return nil
}

// String is the default before parsing (pflag's DefValue).
func (v *flagValue) String() string { return v.value.String() }

// Type names the kind of value in --help.
func (v *flagValue) Type() string { return v.value.Type() }

// AddFlags registers --config and the flag of every setting on fs, each
// annotated with its group for FlagUsages, and returns the Flags that Load
// reads after fs is parsed.
func AddFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{probe: orchestrator.Defaults()}
	fs.StringVar(&f.file, "config", "", "JSON configuration file (env "+EnvConfigFile+")")
	_ = fs.SetAnnotation("config", groupAnnotation, []string{groupServer})
	for i := range settings {
		s := &settings[i]
		if s.Flag == "" {
			continue
		}
		fv := &flagValue{setting: s, value: s.field(&f.probe)}
		usage := s.Usage + " (env " + s.Env + ")"
		if def := fv.String(); s.Default != "" && (def == "" || def == "0") {
			usage += " (default " + s.Default + ")" // pflag shows no zero default
		}
		fl := fs.VarPF(fv, s.Flag, "", usage)
		if b, ok := fv.value.(boolValue); ok && b.optional {
			fl.NoOptDefVal = "true"
		}
		_ = fs.SetAnnotation(s.Flag, groupAnnotation, []string{s.Group})
		f.flags = append(f.flags, fv)
	}
	return f
}

// Load builds the configuration from the defaults, the file (--config,
// else $BERTH_CONFIG), the environment (getenv) and the parsed flags, and
// validates it. Errors name their source and the setting.
func (f *Flags) Load(getenv func(string) string) (orchestrator.Config, error) {
	cfg := orchestrator.Defaults()
	path := f.file
	if path == "" {
		path = getenv(EnvConfigFile)
	}
	if path != "" {
		if err := readFile(path, &cfg); err != nil {
			return cfg, err
		}
	}
	if err := readEnv(&cfg, getenv); err != nil {
		return cfg, err
	}
	if err := f.apply(&cfg); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

// Load parses args as the flags of `orchestrator serve` (as pflag does:
// --name value, --name=value) and loads the configuration with them. It is
// the command without cobra, for tests.
func Load(args []string, getenv func(string) string) (orchestrator.Config, error) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return orchestrator.Defaults(), err
	}
	if fs.NArg() > 0 {
		return orchestrator.Defaults(), fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	return f.Load(getenv)
}

// readFile applies the JSON file at path: an object whose keys are the
// settings' keys (matched as encoding/json matches struct fields: exactly,
// else ignoring case). An unknown key is an error.
func readFile(path string, cfg *orchestrator.Config) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	if err := decodeFile(b, cfg); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	return nil
}

// decodeFile applies the keys of the JSON object b in their order; null
// sets nothing.
func decodeFile(b []byte, cfg *orchestrator.Config) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("want a JSON object, got %v", tok)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		s := byKey(key)
		if s == nil {
			return fmt.Errorf("unknown key %q", key)
		}
		if err := s.field(cfg).setJSON(raw); err != nil {
			return fmt.Errorf("%s: %w", s.Key, err)
		}
	}
	_, err = dec.Token()
	return err
}

// byKey finds the setting of a file key.
func byKey(key string) *setting {
	var folded *setting
	for i := range settings {
		s := &settings[i]
		switch {
		case s.Key == "":
		case s.Key == key:
			return s
		case folded == nil && strings.EqualFold(s.Key, key):
			folded = s
		}
	}
	return folded
}

// readEnv applies every setting's variable that is set and not empty.
func readEnv(cfg *orchestrator.Config, getenv func(string) string) error {
	var errs []error
	for i := range settings {
		s := &settings[i]
		if text := getenv(s.Env); text != "" {
			if err := s.field(cfg).Set(text); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", s.Env, err))
			}
		}
	}
	return errors.Join(errs...)
}

// apply applies the flags the command line gave with a value.
func (f *Flags) apply(cfg *orchestrator.Config) error {
	for _, fv := range f.flags {
		if !fv.set {
			continue
		}
		texts := []string{fv.text}
		if len(fv.texts) > 0 {
			texts = fv.texts // a repeatable flag: each one adds
		}
		for _, text := range texts {
			if err := fv.setting.field(cfg).Set(text); err != nil {
				return fmt.Errorf("--%s: %w", fv.setting.Flag, err)
			}
		}
	}
	return nil
}

// FlagUsages lists the flags of fs under their groups' headings, sorted
// by name within each (flags of no group, such as --help, come last),
// then the secrets, which have no flag.
func FlagUsages(fs *pflag.FlagSet) string {
	sets := map[string]*pflag.FlagSet{}
	fs.VisitAll(func(fl *pflag.Flag) {
		g := "Other"
		if a := fl.Annotations[groupAnnotation]; len(a) > 0 {
			g = a[0]
		}
		if sets[g] == nil {
			sets[g] = pflag.NewFlagSet(g, pflag.ContinueOnError)
		}
		sets[g].AddFlag(fl)
	})
	var b strings.Builder
	for _, g := range append(groups, "Other") {
		if set := sets[g]; set != nil {
			fmt.Fprintf(&b, "%s flags:\n%s\n", g, set.FlagUsages())
		}
	}
	fmt.Fprintf(&b, "%s (environment or file; no flag, since a command line shows in ps):\n", groupSecrets)
	for _, s := range settings {
		if s.Flag == "" {
			fmt.Fprintf(&b, "  %-22s %s\n", s.Env, s.Usage)
		}
	}
	return b.String()
}
