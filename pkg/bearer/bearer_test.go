package bearer_test

import (
	"net/http"
	"slices"
	"testing"

	"github.com/berth-dev/berth/pkg/bearer"
	"google.golang.org/grpc/metadata"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in, tok string
		ok            bool
	}{
		{"missing", "", "", false},
		{"scheme only", "Bearer", "", false},
		{"scheme and space", "Bearer ", "", false},
		{"empty token", "Bearer    ", "", false},
		{"wrong scheme", "Basic dXNlcjpwYXNz", "", false},
		{"no space", "Bearertok", "", false},
		{"token", "Bearer tok-1", "tok-1", true},
		{"lower case scheme", "bearer tok-1", "tok-1", true},
		{"upper case scheme", "BEARER tok-1", "tok-1", true},
		{"spaces trimmed", "Bearer   tok-1  ", "tok-1", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, ok := bearer.Parse(tc.in)
			if tok != tc.tok || ok != tc.ok {
				t.Errorf("Parse(%q) = %q, %v; want %q, %v", tc.in, tok, ok, tc.tok, tc.ok)
			}
		})
	}
}

func TestFromHeaderAndMD(t *testing.T) {
	h := http.Header{}
	h.Add("Authorization", "Basic x")
	h.Add("Authorization", "Bearer a")
	h.Add("Authorization", "Bearer ")
	h.Add("Authorization", "bearer b")
	if got := slices.Collect(bearer.FromHeader(h)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("FromHeader = %q, want [a b]", got)
	}
	if got := slices.Collect(bearer.FromHeader(http.Header{})); len(got) != 0 {
		t.Errorf("FromHeader(no header) = %q", got)
	}
	md := metadata.Pairs("authorization", "Bearer a", "authorization", "token b", "x-berth-token", "c")
	if got := slices.Collect(bearer.FromMD(md)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("FromMD = %q, want [a]", got)
	}
	// Stopping early stops the walk.
	for tok := range bearer.FromHeader(h) {
		if tok != "a" {
			t.Fatalf("first token %q", tok)
		}
		break
	}
}

func TestSecret(t *testing.T) {
	s := bearer.NewSecret("operator-token")
	for _, tc := range []struct {
		name, tok string
		want      bool
	}{
		{"right token", "operator-token", true},
		{"wrong token", "operator-tokem", false},
		{"prefix", "operator", false},
		{"longer", "operator-token-", false},
		{"empty", "", false},
	} {
		if got := s.Matches(tc.tok); got != tc.want {
			t.Errorf("%s: Matches(%q) = %v, want %v", tc.name, tc.tok, got, tc.want)
		}
	}
	if !s.IsSet() {
		t.Error("IsSet() = false for a token")
	}
	var zero bearer.Secret
	if unset := bearer.NewSecret(""); unset.IsSet() || unset.Matches("") || zero.Matches("") || unset != zero {
		t.Error("the empty token must give the unset Secret, which matches nothing")
	}
}

func TestIndex(t *testing.T) {
	secrets := []bearer.Secret{bearer.NewSecret("a-token"), bearer.NewSecret("b-token"), {}}
	for tok, want := range map[string]int{"a-token": 0, "b-token": 1, "c-token": -1, "": -1} {
		if got := bearer.Index(tok, secrets); got != want {
			t.Errorf("Index(%q) = %d, want %d", tok, got, want)
		}
	}
	if got := bearer.Index("a-token", nil); got != -1 {
		t.Errorf("Index(no secrets) = %d", got)
	}
}
