package files

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ArchiveRoutePrefix is the URL path under which the raw archive routes
// live: the rest of the URL path is the absolute path of the directory (or
// file) archived.
const ArchiveRoutePrefix = "/v1/archive"

// ServeArchive serves the raw archive routes, where the request or
// response body is a tar stream:
//
//	PUT  /v1/archive/{path}  extract the body (application/x-tar; with
//	                         Content-Encoding: gzip, a gzip-compressed tar)
//	                         into the directory path (FS.ExtractArchive);
//	                         query: parents (default true: missing parents of
//	                         a missing target are created); 200 OK with
//	                         {"path": "...", "entries": N, "bytes": N, "created": bool}
//	GET  /v1/archive/{path}  the archive of the file or directory path, entries
//	                         named after its base name; query: gzip=true
//	                         (body application/gzip instead of
//	                         application/x-tar), follow=true (follow path
//	                         itself when it is a symlink)
//
// Errors and refused uploads are answered as the file routes answer them
// (JSON errors, the body drained first). An error in the middle of a
// download aborts the response, so that the client sees a broken body, not
// a short archive.
func (h *HTTPHandler) ServeArchive(w http.ResponseWriter, r *http.Request) {
	p, err := pathUnder(ArchiveRoutePrefix, r.URL.Path)
	if err != nil {
		edge.DrainBody(w, r, false)
		writeError(w, err)
		return
	}
	switch r.Method {
	case http.MethodPut:
		h.putArchive(w, r, p)
	case http.MethodGet:
		h.getArchive(w, r, p)
	default:
		edge.DrainBody(w, r, false)
		w.Header().Set("Allow", "GET, PUT")
		writeStatus(w, http.StatusMethodNotAllowed, status.New(codes.Unimplemented, "method "+r.Method+" not allowed on "+ArchiveRoutePrefix+"/"))
	}
}

// boolQuery parses the boolean query parameters of a request, which may
// carry only those named in known (with their defaults).
func boolQuery(r *http.Request, known map[string]bool) (map[string]bool, error) {
	out := make(map[string]bool, len(known))
	for k, v := range known {
		out[k] = v
	}
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	for k, vs := range r.URL.Query() {
		if _, ok := known[k]; !ok {
			return nil, errdefs.InvalidArgument(k, "unknown query parameter (known: %s)", strings.Join(names, ", "))
		}
		b, err := strconv.ParseBool(vs[len(vs)-1])
		if err != nil {
			return nil, errdefs.InvalidArgument(k, "must be true or false, got %q", vs[len(vs)-1])
		}
		out[k] = b
	}
	return out, nil
}

func (h *HTTPHandler) putArchive(w http.ResponseWriter, r *http.Request, p string) {
	body := &edge.ReadTracker{R: r.Body}
	refuse := func(err error) {
		edge.DrainBody(w, r, body.Consumed())
		writeError(w, err)
	}
	q, err := boolQuery(r, map[string]bool{"parents": true})
	if err != nil {
		refuse(err)
		return
	}
	opts := ArchiveUploadOptions{Path: p, CreateParents: q["parents"]}
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		opts.Gzip = true
	default:
		refuse(errdefs.InvalidArgument("Content-Encoding", "must be gzip or absent, got %q", enc))
		return
	}
	res, err := h.fs.ExtractArchive(r.Context(), opts, body)
	if err != nil {
		refuse(err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(struct {
		Path    string `json:"path"`
		Entries int64  `json:"entries"`
		Bytes   int64  `json:"bytes"`
		Created bool   `json:"created"`
	}{res.Path, res.Entries, res.Bytes, res.Created})
}

func (h *HTTPHandler) getArchive(w http.ResponseWriter, r *http.Request, p string) {
	q, err := boolQuery(r, map[string]bool{"gzip": false, "follow": false})
	if err != nil {
		writeError(w, err)
		return
	}
	if _, err := h.fs.StatArchive(r.Context(), p, q["follow"]); err != nil {
		writeError(w, err)
		return
	}
	ct := "application/x-tar"
	if q["gzip"] {
		ct = "application/gzip"
	}
	w.Header().Set("Content-Type", ct)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if err := h.fs.WriteArchive(r.Context(), p, w, ArchiveDownloadOptions{Gzip: q["gzip"], FollowLink: q["follow"]}); err != nil {
		if r.Context().Err() == nil {
			h.fs.log.Warn("archive download interrupted", "path", p, "error", err)
		}
		panic(http.ErrAbortHandler) // the client must not take a cut archive for a whole one
	}
}
