package agent_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/uploadtest"
	"google.golang.org/grpc/codes"
)

// TestRefusedUploadsReadableByWholeBodyClients runs a real agent (edge
// listener, auth middleware, raw file routes) and sends refused multi-MiB
// uploads with clients that write the whole body before reading: Python's
// urllib and a raw TCP client. Each must read the 4xx JSON error, the 401
// of the auth middleware included.
func TestRefusedUploadsReadableByWholeBodyClients(t *testing.T) {
	a := startAgent(t)
	const size = 24 << 20
	missing := a.base + "/v1/files" + filepath.Join(a.workDir, "no", "such", "f") + "?parents=false"
	cases := []struct {
		name   string
		url    string
		token  string
		status int
		code   codes.Code
	}{
		{"no token", a.base + "/v1/files" + filepath.Join(a.workDir, "f"), "", http.StatusUnauthorized, codes.Unauthenticated},
		{"wrong token", a.base + "/v1/files" + filepath.Join(a.workDir, "f"), "wrong", http.StatusUnauthorized, codes.Unauthenticated},
		{"parent missing with parents=false", missing, testToken, http.StatusNotFound, codes.NotFound},
		{"invalid parents value", a.base + "/v1/files" + filepath.Join(a.workDir, "f") + "?parents=maybe", testToken, http.StatusBadRequest, codes.InvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := func(client string, r uploadtest.Response) {
				t.Helper()
				if r.Status != c.status || r.Code() != int(c.code) {
					t.Errorf("%s: got %d %s, want %d with code %d", client, r.Status, r.Body, c.status, c.code)
				}
			}
			check("python3 urllib", uploadtest.PythonPut(t, c.url, c.token, size))
			var hdr http.Header
			if c.token != "" {
				hdr = http.Header{"Authorization": {"Bearer " + c.token}}
			}
			check("raw TCP", uploadtest.RawPut(t, c.url, hdr, size, false))
		})
	}
	if _, err := os.Stat(filepath.Join(a.workDir, "f")); err == nil {
		t.Fatal("a refused upload wrote its file")
	}
	// The default creates the parents, for the same client.
	r := uploadtest.PythonPut(t, a.base+"/v1/files"+filepath.Join(a.workDir, "x", "y", "z.bin"), testToken, 1<<20)
	if r.Status != http.StatusCreated {
		t.Fatalf("default upload into missing parents: %d %s", r.Status, r.Body)
	}
}
