package cli

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// safe returns s fit for an operator's terminal: text that came from a
// caller or a sandbox (a release reason, a label, a file name) may carry
// escape sequences that would colour, move or rewrite the terminal. Strings
// with only printable characters are returned unchanged; otherwise every
// control or format character and invalid byte is written as a Go escape
// (\x1b, \n, \u202e), the way strconv.Quote does, without the quotes.
func safe(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\\':
			b.WriteString(`\\`)
		case printable(r):
			b.WriteRune(r)
		default:
			q := strconv.QuoteRune(r) // 'x' with the escape inside
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}

func printable(r rune) bool {
	return r == ' ' || (strconv.IsPrint(r) && !unicode.Is(unicode.Cf, r))
}

func needsEscape(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for _, r := range s {
		if !printable(r) {
			return true
		}
	}
	return false
}
