package agent

import (
	"net/http"
)

// maxJSONBody bounds REST request bodies other than raw file uploads.
const maxJSONBody = 32 << 20

// limitBody caps request bodies, except on the raw file routes, which stream.
func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxJSONBody)
		}
		next.ServeHTTP(w, r)
	})
}
