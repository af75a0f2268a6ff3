package files

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RoutePrefix is the URL path under which the raw file routes live: the
// rest of the URL path is the absolute file path.
const RoutePrefix = "/v1/files"

// PathFromURL returns the absolute, clean file path that a raw-route URL
// path (already percent-decoded, as in http.Request.URL.Path) names:
// "/v1/files/workspace/a.txt" is "/workspace/a.txt", and "/v1/files/" is "/".
// A URL path outside RoutePrefix, or naming an invalid path, is
// InvalidArgument("path").
func PathFromURL(urlPath string) (string, error) { return pathUnder(RoutePrefix, urlPath) }

// pathUnder is PathFromURL for the routes under prefix.
func pathUnder(prefix, urlPath string) (string, error) {
	rest, ok := strings.CutPrefix(urlPath, prefix)
	if !ok || (rest != "" && rest[0] != '/') {
		return "", errdefs.InvalidArgument("path", "URL path %q is not under %s/", urlPath, prefix)
	}
	if rest == "" {
		rest = "/"
	}
	return validate.AbsPath("path", rest)
}

// HTTPHandler serves the raw-bytes file routes, where the request or
// response body is the file itself:
//
//	PUT  /v1/files/{path}  upload; query: mode (octal, e.g. 0755), parents
//	                       (default true: missing parent directories are
//	                       created; parents=false refuses them with 404),
//	                       overwrite=replace|fail, sha256 (expected hex digest),
//	                       digest=sha256|none (default sha256; none computes no
//	                       digest and answers without "sha256"; not with sha256=);
//	                       201 Created (200 OK when a file was replaced) with
//	                       {"path": "...", "size": N, "sha256": "...", "created": bool}
//	GET  /v1/files/{path}  download (HEAD too); query: offset, length (0 = to the
//	                       end), or a single "Range: bytes=" header (206, or 416
//	                       when unsatisfiable); body application/octet-stream
//
// Unknown query parameters are rejected. A refused upload first reads and
// discards the rest of the body (see edge.DrainBody), so that clients that
// send the whole body before reading (Python's urllib and requests) read
// the error instead of a connection reset. Errors are JSON
// {"code": <gRPC code>, "message": "...", "details": []} with the HTTP status
// grpc-gateway uses for that code. Neither route buffers the file.
//
// ServeHTTP takes the file path from the URL path (see PathFromURL), so mount
// the handler at RoutePrefix + "/" (and ArchiveRoutePrefix + "/" for the
// archive routes) on an http.ServeMux; Put and Get take an
// already extracted path, for other routers.
type HTTPHandler struct {
	fs *FS
}

// NewHTTPHandler returns the raw file routes backed by fsys.
func NewHTTPHandler(fsys *FS) *HTTPHandler { return &HTTPHandler{fs: fsys} }

// ServeHTTP dispatches PUT to Put and GET and HEAD to Get, with the path
// taken from r.URL.Path; other methods get 405. URL paths under
// ArchiveRoutePrefix go to the archive routes (see ServeArchive).
func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, ArchiveRoutePrefix+"/") {
		h.ServeArchive(w, r)
		return
	}
	switch r.Method {
	case http.MethodPut, http.MethodGet, http.MethodHead:
	default:
		edge.DrainBody(w, r, false)
		w.Header().Set("Allow", "GET, HEAD, PUT")
		writeStatus(w, http.StatusMethodNotAllowed, status.New(codes.Unimplemented, "method "+r.Method+" not allowed on "+RoutePrefix+"/"))
		return
	}
	// PathFromURL cleans the path; Put wants to see a trailing slash.
	p, err := PathFromURL(r.URL.Path)
	if err != nil {
		edge.DrainBody(w, r, false)
		writeError(w, err)
		return
	}
	if r.Method == http.MethodPut {
		if strings.HasSuffix(r.URL.Path, "/") && p != "/" {
			p += "/"
		}
		h.Put(w, r, p)
		return
	}
	h.Get(w, r, p)
}

// Put uploads the request body to the absolute path p (see HTTPHandler for
// the query parameters and the response).
func (h *HTTPHandler) Put(w http.ResponseWriter, r *http.Request, p string) {
	body := &edge.ReadTracker{R: r.Body}
	refuse := func(err error) {
		edge.DrainBody(w, r, body.Consumed())
		writeError(w, err)
	}
	opts := UploadOptions{Path: p, CreateParents: true}
	for k, vs := range r.URL.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "mode":
			u, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(v, "0o"), "0O"), 8, 32)
			if err != nil {
				refuse(errdefs.InvalidArgument("mode", "must be octal permission bits like 0644, got %q", v))
				return
			}
			m, err := modeFromUnix("mode", uint32(u))
			if err != nil {
				refuse(err)
				return
			}
			opts.Mode = m
		case "parents":
			b, err := strconv.ParseBool(v)
			if err != nil {
				refuse(errdefs.InvalidArgument("parents", "must be true or false, got %q", v))
				return
			}
			opts.CreateParents = b
		case "overwrite":
			switch strings.ToLower(v) {
			case "", "replace":
				opts.Overwrite = OverwriteReplace
			case "fail":
				opts.Overwrite = OverwriteFail
			default:
				refuse(errdefs.InvalidArgument("overwrite", "must be replace or fail, got %q", v))
				return
			}
		case "sha256":
			opts.ExpectedSHA256 = v
		case "digest":
			d := strings.ToLower(v)
			if d != "" && d != "sha256" && d != "none" {
				refuse(errdefs.InvalidArgument("digest", "must be sha256 or none, got %q", v))
				return
			}
			opts.NoDigest = d == "none"
		default:
			refuse(errdefs.InvalidArgument(k, "unknown query parameter (known: mode, parents, overwrite, sha256, digest)"))
			return
		}
	}
	if opts.NoDigest && opts.ExpectedSHA256 != "" {
		refuse(errdefs.InvalidArgument("digest", "none cannot be combined with sha256=, which needs the digest"))
		return
	}
	res, err := h.fs.Upload(r.Context(), opts, body)
	if err != nil {
		refuse(err)
		return
	}
	code := http.StatusOK
	if res.Created {
		code = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Path    string `json:"path"`
		Size    int64  `json:"size"`
		SHA256  string `json:"sha256,omitempty"` // "" only with digest=none
		Created bool   `json:"created"`
	}{res.Path, res.Size, res.SHA256, res.Created})
}

// Get streams the file at the absolute path p, or the range that the
// offset/length query parameters or a Range header select (see
// HTTPHandler). HEAD requests get the headers only.
func (h *HTTPHandler) Get(w http.ResponseWriter, r *http.Request, p string) {
	var offset, length int64
	var windowed bool
	for k, vs := range r.URL.Query() {
		v := vs[len(vs)-1]
		switch k {
		case "offset", "length":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(w, errdefs.InvalidArgument(k, "must be an integer, got %q", v))
				return
			}
			if k == "offset" {
				offset = n
			} else {
				length = n
			}
			windowed = true
		default:
			writeError(w, errdefs.InvalidArgument(k, "unknown query parameter (known: offset, length)"))
			return
		}
	}
	rangeHdr := r.Header.Get("Range")
	if windowed && rangeHdr != "" {
		writeError(w, errdefs.InvalidArgument("range", "use either the Range header or offset/length, not both"))
		return
	}

	rd, err := h.fs.Open(r.Context(), p, offset, length)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rd.Close()
	size := rd.Info.Size
	modTime := rd.Info.ModTime.UTC().Truncate(time.Second)

	code := http.StatusOK
	hdr := w.Header()
	if rangeHdr != "" && ifRangeMatches(r.Header.Get("If-Range"), modTime) {
		start, n, ok, err := parseRange(rangeHdr, size)
		if err != nil {
			hdr.Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			writeStatus(w, http.StatusRequestedRangeNotSatisfiable, status.New(codes.OutOfRange, err.Error()))
			return
		}
		if ok {
			if err := rd.limit(start, n); err != nil {
				writeError(w, err)
				return
			}
			code = http.StatusPartialContent
			hdr.Set("Content-Range", "bytes "+strconv.FormatInt(start, 10)+"-"+strconv.FormatInt(start+n-1, 10)+"/"+strconv.FormatInt(size, 10))
		}
	}
	hdr.Set("Content-Type", "application/octet-stream")
	hdr.Set("Content-Length", strconv.FormatInt(rd.Length, 10))
	hdr.Set("Accept-Ranges", "bytes")
	hdr.Set("Last-Modified", modTime.Format(http.TimeFormat))
	hdr.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	if r.Method == http.MethodHead {
		return
	}
	// Reader.WriteTo lets net/http use sendfile. Once the header is out, an
	// error can only cut the body short, which the client sees as a
	// Content-Length mismatch.
	if _, err := io.Copy(w, rd); err != nil && r.Context().Err() == nil {
		h.fs.log.Warn("download interrupted", "path", p, "error", err)
	}
}

// ifRangeMatches reports whether a Range header applies given If-Range: it
// does when If-Range is absent or is the file's Last-Modified date. Entity
// tags never match (no ETags are sent).
func ifRangeMatches(ifRange string, modTime time.Time) bool {
	if ifRange == "" {
		return true
	}
	t, err := http.ParseTime(ifRange)
	return err == nil && t.Equal(modTime)
}

var errUnsatisfiable = errors.New("requested range not satisfiable")

// parseRange parses a Range header against size. It returns ok=false for
// headers to ignore (another unit, or several ranges, which RFC 9110 lets a
// server serve as a full 200), and an error for a syntactically invalid or
// unsatisfiable single byte range.
func parseRange(h string, size int64) (start, n int64, ok bool, err error) {
	spec, found := strings.CutPrefix(h, "bytes=")
	if !found {
		return 0, 0, false, nil
	}
	if strings.Contains(spec, ",") {
		return 0, 0, false, nil
	}
	first, last, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false, errUnsatisfiable
	}
	first, last = strings.TrimSpace(first), strings.TrimSpace(last)
	if first == "" {
		// Suffix range: the last N bytes.
		sfx, perr := strconv.ParseInt(last, 10, 64)
		if perr != nil || sfx <= 0 || size == 0 {
			return 0, 0, false, errUnsatisfiable
		}
		if sfx > size {
			sfx = size
		}
		return size - sfx, sfx, true, nil
	}
	start, perr := strconv.ParseInt(first, 10, 64)
	if perr != nil || start < 0 || start >= size {
		return 0, 0, false, errUnsatisfiable
	}
	end := size - 1
	if last != "" {
		e, perr := strconv.ParseInt(last, 10, 64)
		if perr != nil || e < start {
			return 0, 0, false, errUnsatisfiable
		}
		if e < end {
			end = e
		}
	}
	return start, end - start + 1, true, nil
}

// writeError writes err as grpc-gateway would: the HTTP status for its
// gRPC code, and a JSON body with the code and message.
func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(errgrpc.ToGRPC(err))
	writeStatus(w, runtime.HTTPStatusFromCode(st.Code()), st)
}

func writeStatus(w http.ResponseWriter, httpStatus int, st *status.Status) {
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Details []any  `json:"details"`
	}{int(st.Code()), st.Message(), []any{}})
}
