package lease

import (
	"bytes"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestNewTokens(t *testing.T) {
	if _, err := NewTokens([]byte("short")); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("short secret: err %v, want InvalidArgument", err)
	}
	secret := bytes.Repeat([]byte("s"), MinSecretLen)
	tk, err := NewTokens(secret)
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdefghijklmnop"
	tok := tk.Token(id)
	// The secret is copied: changing the caller's slice changes nothing.
	secret[0] = 'x'
	if got, ok := tk.VerifyToken(tok); !ok || got != id || tk.Token(id) != tok {
		t.Fatal("the Tokens changed with the caller's secret slice")
	}
}
