package envd

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// envs answers GET /envs: the environment processes start with, as a
// JSON object.
func (s *Service) envs(w http.ResponseWriter, _ *http.Request) {
	kvs, err := s.cfg.Environ()
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	env := map[string]string{}
	for _, kv := range kvs {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(env)
}

// download answers GET /files?path=P: the file's bytes, gzip-compressed
// when the client accepts gzip.
func (s *Service) download(w http.ResponseWriter, r *http.Request) {
	id := identityFrom(r.Context())
	p := r.URL.Query().Get("path")
	if p == "" {
		writeHTTPError(w, errdefs.InvalidArgument("path", "is required"))
		return
	}
	rd, err := s.fsFor(id).Open(r.Context(), id.abs(p), 0, 0)
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	defer rd.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": rd.Info.Name}))
	if acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		// Clients such as httpx ask for gzip on every request: the
		// fastest level keeps large downloads from being CPU-bound.
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		if _, err := io.Copy(gz, rd); err != nil {
			s.log.Debug("envd download cut", "path", rd.Info.Path, "err", err)
			return
		}
		_ = gz.Close()
		return
	}
	h.Set("Content-Length", strconv.FormatInt(rd.Length, 10))
	if _, err := io.Copy(w, rd); err != nil {
		s.log.Debug("envd download cut", "path", rd.Info.Path, "err", err)
	}
}

func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, enc := range strings.Split(v, ",") {
			name, q, _ := strings.Cut(strings.TrimSpace(enc), ";")
			if strings.EqualFold(strings.TrimSpace(name), "gzip") && strings.ReplaceAll(q, " ", "") != "q=0" {
				return true
			}
		}
	}
	return false
}

// writeInfo is one written file in the answer to POST /files.
type writeInfo struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// upload answers POST /files: the multipart parts named "file" (each at
// the path query parameter for the first, else at its filename) or the
// raw body (application/octet-stream; path required), gzip-decoded when
// Content-Encoding says so. Missing parent directories are created; an
// existing file is replaced.
func (s *Service) upload(w http.ResponseWriter, r *http.Request) {
	id := identityFrom(r.Context())
	body := io.Reader(r.Body)
	if enc := strings.TrimSpace(r.Header.Get("Content-Encoding")); enc != "" && !strings.EqualFold(enc, "identity") {
		if !strings.EqualFold(enc, "gzip") {
			s.fail(w, r, errdefs.InvalidArgument("Content-Encoding", "only gzip is supported, got %q", enc))
			return
		}
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			s.fail(w, r, errdefs.InvalidArgument("body", "not gzip: %v", err))
			return
		}
		defer gz.Close()
		body = gz
	}
	fsys := s.fsFor(id)
	// envd's answer has no digest, so none is computed.
	put := func(p string, src io.Reader) (writeInfo, error) {
		res, err := fsys.Upload(r.Context(), files.UploadOptions{Path: id.abs(p), CreateParents: true, NoDigest: true}, src)
		if err != nil {
			return writeInfo{}, err
		}
		return writeInfo{Path: res.Path, Name: filepath.Base(res.Path), Type: "file"}, nil
	}
	qpath := r.URL.Query().Get("path")
	var out []writeInfo
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "multipart/form-data" {
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				s.fail(w, r, errdefs.InvalidArgument("body", "bad multipart body: %v", err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			p := qpath
			if p == "" || len(out) > 0 {
				p = partFilename(part)
			}
			if p == "" {
				s.fail(w, r, errdefs.InvalidArgument("path", "is required (a query parameter, or the part's filename)"))
				return
			}
			info, err := put(p, part)
			if err != nil {
				s.fail(w, r, err)
				return
			}
			out = append(out, info)
		}
		if len(out) == 0 {
			s.fail(w, r, errdefs.InvalidArgument("file", "the multipart body has no part named file"))
			return
		}
	} else {
		if qpath == "" {
			s.fail(w, r, errdefs.InvalidArgument("path", "is required for an application/octet-stream upload"))
			return
		}
		info, err := put(qpath, body)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		out = append(out, info)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// partFilename is a part's filename as sent (a path, which
// multipart.Part.FileName would cut to its base name).
func partFilename(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// fail answers an upload with err, reading what is left of the body first
// so that clients that send it whole before reading see the answer.
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	edge.DrainBody(w, r, false)
	writeHTTPError(w, err)
}
