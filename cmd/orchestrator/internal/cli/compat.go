package cli

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// rewriteSingleDash keeps the old command line working: it was parsed by
// Go's flag package, which takes long flags with one dash (-addr X,
// -cwd=/x). For the command args select, every "-name" or "-name=value"
// whose name is one of that command's long flags (its own or inherited)
// becomes "--name…". Shorthands and their clusters (-o, -w, -it) are left
// alone, as are a flag's separate value, everything after "--", and the
// arguments of commands that parse their own flags (serve).
func rewriteSingleDash(root *cobra.Command, args []string) []string {
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil || cmd.DisableFlagParsing {
		return args
	}
	out := make([]string, 0, len(args))
	skipValue := false // the previous flag takes this argument as its value
	for i, a := range args {
		switch {
		case a == "--":
			return append(out, args[i:]...)
		case skipValue || len(a) < 2 || a[0] != '-':
			skipValue = false
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a[2:], "=")
			skipValue = !hasValue && needsValue(lookupFlag(cmd, name))
		default:
			name, _, hasValue := strings.Cut(a[1:], "=")
			if f := lookupFlag(cmd, name); len(name) > 1 && (f != nil || name == "help") {
				a = "-" + a
				skipValue = !hasValue && needsValue(f)
			} else if len(name) == 1 {
				skipValue = !hasValue && needsValue(lookupShorthand(cmd, name))
			}
		}
		out = append(out, a)
	}
	return out
}

// lookupFlag finds a long flag of cmd, its own or inherited.
func lookupFlag(cmd *cobra.Command, name string) *pflag.Flag {
	if f := cmd.LocalFlags().Lookup(name); f != nil {
		return f
	}
	return cmd.InheritedFlags().Lookup(name)
}

// lookupShorthand finds a one-letter flag of cmd, its own or inherited.
func lookupShorthand(cmd *cobra.Command, short string) *pflag.Flag {
	if f := cmd.LocalFlags().ShorthandLookup(short); f != nil {
		return f
	}
	return cmd.InheritedFlags().ShorthandLookup(short)
}

// needsValue reports whether f takes a value from the next argument.
func needsValue(f *pflag.Flag) bool {
	return f != nil && f.NoOptDefVal == ""
}
