package lease

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// SignedKind is what a signed URL opens.
type SignedKind string

// Kinds of signed URLs.
const (
	// SignedPort opens one preview port of a lease (any path under it).
	SignedPort SignedKind = "port"
	// SignedDownload downloads one file (GET, HEAD).
	SignedDownload SignedKind = "download"
	// SignedUpload uploads one file (PUT).
	SignedUpload SignedKind = "upload"
)

// AnyMethod is SignedScope.Method for a preview URL that any HTTP method
// may use.
const AnyMethod = "*"

// tokenContextSigned derives the signing key of signed URLs from the server
// secret, so a signature is never a lease or agent token and vice versa.
const tokenContextSigned = "signed-url:"

// signedVersion starts every signed message; a change of the format
// changes it, and every older signature stops matching.
const signedVersion = "berth-signed-url/v1"

// SignedScope is what one signed URL grants: one lease, one kind, one port
// (SignedPort) or file path (SignedDownload, SignedUpload), one method,
// until Expires. Every field is covered by the signature.
type SignedScope struct {
	// LeaseID is the lease the URL opens.
	LeaseID string
	// Kind is what it opens.
	Kind SignedKind
	// Port is the preview port (SignedPort only).
	Port int
	// Path is the absolute, clean file path (SignedDownload and
	// SignedUpload only).
	Path string
	// Method is the HTTP method the URL is for: AnyMethod or an upper-case
	// method for SignedPort; "GET" for SignedDownload; "PUT" for
	// SignedUpload. A "GET" signature also serves HEAD.
	Method string
	// Expires is when the URL stops working; it is signed at one-second
	// precision (Unix seconds).
	Expires time.Time
}

// message is the signed text: the fields in a fixed order, separated by
// NUL (which no field may contain: lease ids, kinds, ports and methods are
// plain ASCII, and file paths are refused with a NUL).
func (s SignedScope) message() []byte {
	var b strings.Builder
	for i, f := range []string{signedVersion, s.LeaseID, string(s.Kind), strconv.Itoa(s.Port), s.Path, s.Method,
		strconv.FormatInt(s.Expires.Unix(), 10)} {
		if i > 0 {
			b.WriteByte(0)
		}
		b.WriteString(f)
	}
	return []byte(b.String())
}

// signedMAC is HMAC-SHA256(K, s.message()) with K = HMAC-SHA256(secret,
// "signed-url:").
func (t *Tokens) signedMAC(s SignedScope) []byte {
	key := mac(t.secret, tokenContextSigned, "")
	h := hmac.New(sha256.New, key)
	h.Write(s.message())
	return h.Sum(nil)
}

// Sign returns the signature of s: base64url(HMAC-SHA256(K, message)),
// where K is derived from the server secret (HMAC-SHA256(secret,
// "signed-url:")) and message joins every field of s. Like lease tokens,
// signatures are never stored: they stay valid until they expire or the
// server secret changes; whether the lease is live is checked on each use.
func (t *Tokens) Sign(s SignedScope) string {
	return base64.RawURLEncoding.EncodeToString(t.signedMAC(s))
}

// VerifySigned reports, in constant time, whether sig is the signature of
// s. It checks neither the expiry nor the lease: the caller does (the
// proxy answers expired URLs and ended leases with their own messages).
func (t *Tokens) VerifySigned(s SignedScope, sig string) bool {
	got, err := base64.RawURLEncoding.Strict().DecodeString(sig)
	if err != nil {
		return false
	}
	return hmac.Equal(got, t.signedMAC(s))
}
