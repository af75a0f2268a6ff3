package lease

import (
	"strings"
	"testing"
	"time"
)

func TestSignedScopeVerify(t *testing.T) {
	tk, err := NewTokens([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Unix(1_900_000_000, 0)
	base := SignedScope{LeaseID: "0123456789abcdefghijklmnop", Kind: SignedPort, Port: 8080, Method: AnyMethod, Expires: exp}
	sig := tk.Sign(base)
	if !tk.VerifySigned(base, sig) {
		t.Fatal("a fresh signature does not verify")
	}
	if sig == tk.Token(base.LeaseID) || strings.Contains(tk.Token(base.LeaseID), sig) {
		t.Fatal("a signature equals the lease token")
	}
	// Every field is covered: changing any one must fail.
	changes := map[string]func(s *SignedScope){
		"lease":   func(s *SignedScope) { s.LeaseID = "0123456789abcdefghijklmnoq" },
		"kind":    func(s *SignedScope) { s.Kind = SignedDownload },
		"port":    func(s *SignedScope) { s.Port = 8081 },
		"path":    func(s *SignedScope) { s.Path = "/etc/passwd" },
		"method":  func(s *SignedScope) { s.Method = "GET" },
		"expires": func(s *SignedScope) { s.Expires = exp.Add(time.Second) },
	}
	for name, change := range changes {
		s := base
		change(&s)
		if tk.VerifySigned(s, sig) {
			t.Errorf("a signature verifies after changing the %s", name)
		}
	}
	// Field boundaries cannot be moved: path "a" + method "b" differs from path "ab".
	d := SignedScope{LeaseID: base.LeaseID, Kind: SignedDownload, Path: "/x", Method: "GET", Expires: exp}
	u := d
	u.Kind, u.Method = SignedUpload, "PUT"
	if tk.VerifySigned(u, tk.Sign(d)) {
		t.Error("a download signature verifies as an upload")
	}
	// Tampered, truncated, padded or re-encoded signatures fail.
	for _, bad := range []string{"", sig[:len(sig)-1], sig + "A", sig + "=", strings.ToUpper(sig), "!!!!", flip(sig)} {
		if tk.VerifySigned(base, bad) {
			t.Errorf("tampered signature %q verifies", bad)
		}
	}
	// Another server secret signs differently.
	other, err := NewTokens([]byte("fedcba9876543210fedcba9876543210"))
	if err != nil {
		t.Fatal(err)
	}
	if other.VerifySigned(base, sig) {
		t.Error("a signature verifies under another secret")
	}
}

// flip changes the first character of a base64url string to another valid one.
func flip(s string) string {
	c := byte('A')
	if s[0] == 'A' {
		c = 'B'
	}
	return string(c) + s[1:]
}
