package cli

import (
	"bytes"
	"fmt"
	"github.com/spf13/pflag"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"
)

// processFlags are the flags exec and shell share, docker exec's: where,
// as whom and with what environment the program runs.
type processFlags struct {
	cwd      string
	user     string
	env      []string // -e KEY=VALUE or KEY, in order
	envFiles []string // --env-file, in order
	shell    bool
}

// register adds the shared flags to fs; what names the program in the help
// ("command", "session").
func (o *processFlags) register(fs *pflag.FlagSet, what string) {
	fs.StringVarP(&o.cwd, "workdir", "w", "", "working directory `DIR` in the sandbox (absolute)")
	fs.StringVar(&o.cwd, "cwd", "", "same as --workdir `DIR`")
	fs.StringArrayVarP(&o.env, "env", "e", nil, "set `KEY[=VALUE]` in the "+what+"'s environment (repeatable); KEY alone passes this environment's value")
	fs.StringArrayVar(&o.envFiles, "env-file", nil, "read variables from `FILE`: KEY=VALUE lines, # comments (repeatable)")
	fs.StringVarP(&o.user, "user", "u", "", "run as `USER`: NAME, UID, NAME:GROUP or UID:GID (default: the lease's)")
	fs.BoolVar(&o.shell, "sh", false, "run the arguments as one shell line (/bin/sh -c)")
}

// environment returns the variables to set in the program: those of the
// --env-file files in order, then -e's, a later one overriding an earlier
// one (docker's order). A variable named without a value takes this
// process's value, and is left out when this process has none. Mistakes
// are usage errors naming the flag.
func (o *processFlags) environment(env Env) (map[string]string, error) {
	vars := map[string]string{}
	for _, path := range o.envFiles {
		lines, err := readEnvFile(path)
		if err != nil {
			return nil, usagef("--env-file %s: %v", path, err)
		}
		for _, l := range lines {
			if err := setVar(vars, env, l.text); err != nil {
				return nil, usagef("--env-file %s, line %d: %v", path, l.n, err)
			}
		}
	}
	for _, kv := range o.env {
		if err := setVar(vars, env, kv); err != nil {
			return nil, usagef("-e %q: %v", kv, err)
		}
	}
	if len(vars) == 0 {
		return nil, nil
	}
	return vars, nil
}

// setVar sets KEY=VALUE, or KEY from env (when it is set there), in vars.
func setVar(vars map[string]string, env Env, kv string) error {
	k, v, hasValue := strings.Cut(kv, "=")
	switch {
	case k == "":
		return fmt.Errorf("no variable name (want KEY=VALUE or KEY)")
	case strings.ContainsFunc(k, unicode.IsSpace):
		return fmt.Errorf("variable name %q contains white space", k)
	case strings.ContainsRune(kv, 0):
		return fmt.Errorf("contains a NUL byte")
	}
	if !hasValue {
		var ok bool
		if v, ok = env.lookupEnv(k); !ok {
			return nil
		}
	}
	vars[k] = v
	return nil
}

// envLine is one variable of an env file and its line number.
type envLine struct {
	n    int
	text string
}

// readEnvFile reads a file in docker's --env-file format: one KEY=VALUE
// (or KEY) per line, the value taken as is (no quotes, no expansion),
// leading white space ignored, blank lines and lines starting with # left
// out; it must be UTF-8 (a byte order mark at the start is dropped).
func readEnvFile(path string) ([]envLine, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimPrefix(b, []byte("\xef\xbb\xbf"))
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("not UTF-8")
	}
	var lines []envLine
	for i, line := range strings.Split(string(b), "\n") {
		text := strings.TrimLeftFunc(strings.TrimSuffix(line, "\r"), unicode.IsSpace)
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		lines = append(lines, envLine{n: i + 1, text: text})
	}
	return lines, nil
}
