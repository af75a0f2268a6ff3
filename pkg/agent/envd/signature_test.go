package envd

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSignatureVectors: signatures as E2B's SDKs compute them (the values
// were computed with Python's hashlib and base64 from the same strings).
func TestSignatureVectors(t *testing.T) {
	exp := int64(1700000000)
	for _, c := range []struct {
		got, want string
	}{
		{Signature("/home/user/a.txt", "read", "user", "tok", nil), "v1_p0WqJQYCLtO6YX+e4h7VbpybRsdJbMbIw7clYpulIJk"},
		{Signature("/home/user/a.txt", "write", "", "tok", &exp), "v1_QdtRqpz7xKNXzcs4IguYpySRPZbSGp8b64s9hqOl+wo"},
	} {
		if c.got != c.want {
			t.Errorf("signature %s, want %s", c.got, c.want)
		}
	}
}

// TestSignedFiles: with an access token, /files accepts a signed URL
// instead of the header: upload with "write", download with "read"; a
// signature for the other operation, an expired one, or a wrong header
// beside a valid signature is refused with 401.
func TestSignedFiles(t *testing.T) {
	e := newEnv(t, "s3cret")
	future := time.Now().Add(time.Hour).Unix()
	past := time.Now().Add(-time.Minute).Unix()
	signed := func(path, op string, exp *int64) string {
		q := url.Values{"path": {path}, "signature": {Signature(path, op, "", "s3cret", exp)}}
		if exp != nil {
			q.Set("signature_expiration", strconv.FormatInt(*exp, 10))
		}
		return e.url + "/files?" + q.Encode()
	}
	do := func(method, u, header string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, u, strings.NewReader("signed content"))
		req.Header.Set("Content-Type", "application/octet-stream")
		if header != "" {
			req.Header.Set(AccessTokenHeader, header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do("POST", signed("s.txt", "write", &future), ""); code != 200 {
		t.Fatalf("signed upload: %d %s", code, body)
	}
	if code, body := do("GET", signed("s.txt", "read", nil), ""); code != 200 || body != "signed content" {
		t.Fatalf("signed download: %d %q", code, body)
	}
	for name, c := range map[string]struct{ method, url, header string }{
		"read signature for a write": {"POST", signed("s.txt", "read", nil), ""},
		"write signature for a read": {"GET", signed("s.txt", "write", nil), ""},
		"expired":                    {"GET", signed("s.txt", "read", &past), ""},
		"wrong header":               {"GET", signed("s.txt", "read", nil), "wrong"},
		"other path":                 {"GET", strings.Replace(signed("s.txt", "read", nil), "s.txt", "t.txt", 1), ""},
	} {
		if code, body := do(c.method, c.url, c.header); code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", name, code, body)
		}
	}
}
