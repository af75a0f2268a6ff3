package openhands

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/agent/files"
	"github.com/berth-dev/berth/pkg/agent/git"
	"github.com/berth-dev/berth/pkg/agent/process"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/status"
)

// HealthPath is the open health route (no token needed).
const HealthPath = "/health"

// ConversationPrefix is the optional prefix of the /api routes:
// /api/conversations/{id}/bash/... is /api/bash/....
const ConversationPrefix = "/api/conversations/"

// maxJSONBody bounds the JSON bodies of the bash routes.
const maxJSONBody = 1 << 20

// defaultTimeout is the agent-server's default command timeout, in seconds.
const defaultTimeout = 300

// Config configures a Handler.
type Config struct {
	// Runner runs the bash commands. Required.
	Runner *process.Runner
	// Files serves uploads and downloads. Required.
	Files *files.FS
	// Git serves changes and diffs. Required.
	Git *git.Git
	// WorkDir is the working directory of commands without a cwd. Default "/workspace".
	WorkDir string
	// Version is reported by /server_info. Default "dev".
	Version string
	// Logger receives the handler's logs. Default slog.Default().
	Logger *slog.Logger
	// Fallback, when set, serves the /api routes this handler does not
	// (the sandbox's app, e.g. an agent-server's /api/conversations), with
	// the request as it came. Default nil: those are 404.
	Fallback http.Handler
}

// Handler serves the OpenHands agent-server subset. Create it with New;
// Close stops the commands it started.
type Handler struct {
	cfg     Config
	log     *slog.Logger
	runner  *process.Runner
	store   *store
	started time.Time
	active  atomic.Int64 // unix nanoseconds of the last /api call
	ctx     context.Context
	cancel  context.CancelFunc
}

// New returns a Handler for cfg.
func New(cfg Config) *Handler {
	if cfg.WorkDir == "" {
		cfg.WorkDir = "/workspace"
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Handler{cfg: cfg, log: cfg.Logger, runner: cfg.Runner, store: newStore(), started: time.Now(), ctx: ctx, cancel: cancel}
	h.active.Store(h.started.UnixNano())
	return h
}

// Close stops the running bash commands (their last event says so).
func (h *Handler) Close() { h.cancel() }

// Routes returns the patterns to mount h under in an http.ServeMux.
func (h *Handler) Routes() []string {
	return []string{"GET " + HealthPath, "GET /alive", "GET /server_info", "/api/"}
}

// ServeHTTP serves the routes listed in the package documentation.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch p {
	case HealthPath, "/alive":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		return
	case "/server_info":
		h.serverInfo(w)
		return
	}
	if rest, ok := strings.CutPrefix(p, ConversationPrefix); ok {
		id, tail, found := strings.Cut(rest, "/")
		if id == "" || !found {
			if h.cfg.Fallback != nil {
				h.cfg.Fallback.ServeHTTP(w, r)
				return
			}
			h.fail(w, r, errdefs.NotFound("no route %s", p))
			return
		}
		p = "/api/" + tail
	}
	h.active.Store(time.Now().UnixNano())
	switch route := r.Method + " " + p; route {
	case "POST /api/bash/start_bash_command":
		h.startBash(w, r, false)
	case "POST /api/bash/execute_bash_command":
		h.startBash(w, r, true)
	case "GET /api/bash/bash_events/search":
		h.searchBash(w, r)
	case "GET /api/bash/bash_events/", "GET /api/bash/bash_events":
		h.batchGetBash(w, r)
	case "DELETE /api/bash/bash_events", "DELETE /api/bash/bash_events/":
		writeJSON(w, http.StatusOK, map[string]int{"cleared_count": h.store.clear()})
	case "POST /api/file/upload":
		h.upload(w, r)
	case "GET /api/file/download":
		h.download(w, r)
	case "GET /api/git/changes":
		h.gitChanges(w, r)
	case "GET /api/git/diff":
		h.gitDiff(w, r)
	default:
		if id, ok := strings.CutPrefix(p, "/api/bash/bash_events/"); ok && r.Method == http.MethodGet && !strings.Contains(id, "/") {
			h.getBash(w, id)
			return
		}
		if h.cfg.Fallback != nil {
			h.cfg.Fallback.ServeHTTP(w, r)
			return
		}
		h.fail(w, r, errdefs.NotFound("no route %s %s in the OpenHands agent-server subset berth serves (see docs/openhands.md)", r.Method, p))
	}
}

// serverInfo answers GET /server_info.
func (h *Handler) serverInfo(w http.ResponseWriter) {
	now := time.Now()
	writeJSON(w, http.StatusOK, map[string]any{
		"uptime":        float64(int(now.Sub(h.started).Seconds())),
		"idle_time":     float64(int(now.Sub(time.Unix(0, h.active.Load())).Seconds())),
		"title":         "berth sandbox-agent (OpenHands agent-server subset)",
		"version":       h.cfg.Version,
		"server":        "berth",
		"workspace_dir": h.cfg.WorkDir,
		"usable_tools":  []string{},
		"capabilities":  []string{},
	})
}

// bashRequest is ExecuteBashRequest.
type bashRequest struct {
	Command *string `json:"command"`
	Cwd     *string `json:"cwd"`
	Timeout *int    `json:"timeout"`
}

func (h *Handler) startBash(w http.ResponseWriter, r *http.Request, wait bool) {
	var req bashRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		h.fail(w, r, errdefs.InvalidArgument("body", "not an ExecuteBashRequest JSON object: %v", err))
		return
	}
	if req.Command == nil || strings.TrimSpace(*req.Command) == "" {
		h.fail(w, r, errdefs.InvalidArgument("command", "required"))
		return
	}
	timeout := defaultTimeout
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout < 0 {
		h.fail(w, r, errdefs.InvalidArgument("timeout", "must not be negative, got %d", timeout))
		return
	}
	// A client that rounds a sub-second timeout down sends 0.
	timeout = max(timeout, 1)
	cwd := h.cfg.WorkDir
	if req.Cwd != nil && *req.Cwd != "" {
		cwd = *req.Cwd
	}
	c, err := h.run(h.ctx, *req.Command, cwd, timeout, !wait)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if !wait {
		writeJSON(w, http.StatusOK, c.start)
		return
	}
	select {
	case <-c.doneCh:
		writeJSON(w, http.StatusOK, h.store.last(c))
	case <-r.Context().Done():
		// The command goes on; its events stay searchable.
	}
}

func (h *Handler) searchBash(w http.ResponseWriter, r *http.Request) {
	qs := r.URL.Query()
	q := query{limit: 100}
	switch k := qs.Get("kind__eq"); k {
	case "", kindCommand, kindOutput:
		q.kind = k
	default:
		h.fail(w, r, errdefs.InvalidArgument("kind__eq", "must be BashCommand or BashOutput, got %q", k))
		return
	}
	if v := qs.Get("command_id__eq"); v != "" {
		id, ok := normID(v)
		if !ok {
			h.fail(w, r, errdefs.InvalidArgument("command_id__eq", "not a UUID: %q", v))
			return
		}
		q.commandID = id
	}
	for _, f := range []struct {
		name string
		dst  *time.Time
	}{{"timestamp__gte", &q.gte}, {"timestamp__lt", &q.lt}} {
		if v := qs.Get(f.name); v != "" {
			t, err := parseTime(v)
			if err != nil {
				h.fail(w, r, errdefs.InvalidArgument(f.name, "not a date-time: %q", v))
				return
			}
			*f.dst = t
		}
	}
	if v := qs.Get("order__gt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			h.fail(w, r, errdefs.InvalidArgument("order__gt", "not an integer: %q", v))
			return
		}
		q.orderGT = &n
	}
	switch v := qs.Get("sort_order"); v {
	case "", "TIMESTAMP":
	case "TIMESTAMP_DESC":
		q.desc = true
	default:
		h.fail(w, r, errdefs.InvalidArgument("sort_order", "must be TIMESTAMP or TIMESTAMP_DESC, got %q", v))
		return
	}
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			h.fail(w, r, errdefs.InvalidArgument("limit", "must be an integer from 1 to 100, got %q", v))
			return
		}
		q.limit = n
	}
	if v := qs.Get("page_id"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			h.fail(w, r, errdefs.InvalidArgument("page_id", "not a next_page_id of this agent: %q", v))
			return
		}
		q.pageSeq = n
	}
	items, next := h.store.search(q)
	page := map[string]any{"items": items, "next_page_id": nil}
	if next != "" {
		page["next_page_id"] = next
	}
	writeJSON(w, http.StatusOK, page)
}

// parseTime reads the date-times FastAPI accepts that matter here: RFC
// 3339 with or without a zone (UTC assumed without).
func parseTime(v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	return time.Parse("2006-01-02T15:04:05.999999999", v)
}

func (h *Handler) getBash(w http.ResponseWriter, id string) {
	var e *event
	if nid, ok := normID(id); ok {
		e = h.store.get(nid)
	}
	if e == nil {
		writeError(w, http.StatusNotFound, errdefs.NotFound("no bash event %s", id))
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func (h *Handler) batchGetBash(w http.ResponseWriter, r *http.Request) {
	ids := r.URL.Query()["event_ids"]
	out := make([]*event, len(ids))
	for i, id := range ids {
		if nid, ok := normID(id); ok {
			out[i] = h.store.get(nid)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// upload answers POST /api/file/upload?path=ABS with a multipart body
// whose part "file" is streamed to the file (parents created).
func (h *Handler) upload(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if p == "" {
		h.fail(w, r, errdefs.InvalidArgument("path", "required: the absolute path to write"))
		return
	}
	if !path.IsAbs(p) {
		h.fail(w, r, errdefs.InvalidArgument("path", "must be absolute, got %q", p))
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "multipart/form-data" {
		h.fail(w, r, errdefs.InvalidArgument("body", "must be multipart/form-data with a part named \"file\""))
		return
	}
	mr, err := r.MultipartReader()
	if err != nil {
		h.fail(w, r, errdefs.InvalidArgument("body", "%v", err))
		return
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			h.fail(w, r, errdefs.InvalidArgument("file", "required: no multipart part named \"file\""))
			return
		}
		if err != nil {
			h.fail(w, r, errdefs.InvalidArgument("body", "reading the multipart body: %v", err))
			return
		}
		if part.FormName() != "file" {
			_, _ = io.Copy(io.Discard, part)
			continue
		}
		// The answer carries the size only: no digest is computed.
		res, err := h.cfg.Files.Upload(r.Context(), files.UploadOptions{Path: p, CreateParents: true, NoDigest: true}, part)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"success": true, "file_size": res.Size})
		return
	}
}

// download answers GET /api/file/download?path=ABS with the file's bytes.
func (h *Handler) download(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("path")
	if p == "" || !path.IsAbs(p) {
		h.fail(w, r, errdefs.InvalidArgument("path", "must be an absolute path, got %q", p))
		return
	}
	rd, err := h.cfg.Files.Open(r.Context(), p, 0, 0)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer rd.Close()
	hd := w.Header()
	hd.Set("Content-Type", "application/octet-stream")
	hd.Set("Content-Length", strconv.FormatInt(rd.Length, 10))
	hd.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		if _, err := io.Copy(w, rd); err != nil {
			h.log.Debug("openhands download cut", "path", p, "error", err)
		}
	}
}

// gitChange is GitChange.
type gitChange struct {
	Status string `json:"status"`
	Path   string `json:"path"`
}

// maxNestedFiles bounds the files listed of one untracked directory.
const maxNestedFiles = 10000

// nestedFiles lists the files under dir (relative to the repository top
// level top, ending in "/") as ADDED, without any .git directory, at most
// maxNestedFiles of them; dir itself when it cannot be read.
func nestedFiles(top, dir string) []gitChange {
	var out []gitChange
	root := filepath.Join(top, filepath.FromSlash(dir))
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil // unreadable: skipped
		case d.IsDir() && d.Name() == ".git":
			return filepath.SkipDir
		case d.IsDir():
			return nil
		case len(out) >= maxNestedFiles:
			return filepath.SkipAll
		}
		rel, err := filepath.Rel(top, path)
		if err == nil {
			out = append(out, gitChange{Status: "ADDED", Path: filepath.ToSlash(rel)})
		}
		return nil
	})
	if top == "" || err != nil || len(out) == 0 {
		return []gitChange{{Status: "ADDED", Path: strings.TrimSuffix(dir, "/")}}
	}
	return out
}

// changeStatus maps a change kind to GitChangeStatus.
func changeStatus(k git.ChangeKind) string {
	switch k {
	case git.KindAdded, git.KindUntracked, git.KindCopied:
		return "ADDED"
	case git.KindDeleted:
		return "DELETED"
	case git.KindRenamed:
		return "MOVED"
	}
	return "UPDATED"
}

// gitChanges answers GET /api/git/changes?path=REPO: the repository's
// changes against HEAD (staged, unstaged and untracked files), [] when
// path is not in a repository.
func (h *Handler) gitChanges(w http.ResponseWriter, r *http.Request) {
	p, ok := h.absParam(w, r)
	if !ok {
		return
	}
	if !h.cfg.Git.Available() {
		h.fail(w, r, errdefs.FailedPrecondition("git is not installed in this sandbox image"))
		return
	}
	st, err := h.cfg.Git.Status(r.Context(), p)
	switch {
	case errdefs.IsNotFound(err) || errors.Is(err, errdefs.ErrFailedPrecondition):
		writeJSON(w, http.StatusOK, []gitChange{})
		return
	case err != nil:
		h.fail(w, r, err)
		return
	}
	out := make([]gitChange, 0, len(st.Files))
	for _, f := range st.Files {
		switch {
		case f.Kind == git.KindRenamed:
			// The SDK's git helpers see a rename as the old path gone and
			// the new one added.
			out = append(out, gitChange{Status: "DELETED", Path: f.OldPath}, gitChange{Status: "ADDED", Path: f.Path})
		case f.Kind == git.KindUntracked && strings.HasSuffix(f.Path, "/"):
			// A nested repository (git shows its directory only): its
			// files, as the agent-server lists them.
			out = append(out, nestedFiles(closestRepo(p), f.Path)...)
		default:
			out = append(out, gitChange{Status: changeStatus(f.Kind), Path: f.Path})
		}
	}
	slices.SortStableFunc(out, func(a, b gitChange) int { return strings.Compare(a.Path, b.Path) })
	writeJSON(w, http.StatusOK, out)
}

// gitDiff answers GET /api/git/diff?path=FILE: the file's text at HEAD and
// in the work tree; both null when the file is in no repository, is
// binary, or has no version anywhere.
func (h *Handler) gitDiff(w http.ResponseWriter, r *http.Request) {
	p, ok := h.absParam(w, r)
	if !ok {
		return
	}
	type gitDiff struct {
		Modified *string `json:"modified"`
		Original *string `json:"original"`
	}
	repo := closestRepo(p)
	if repo == "" || !h.cfg.Git.Available() {
		writeJSON(w, http.StatusOK, gitDiff{})
		return
	}
	d, err := h.cfg.Git.Diff(r.Context(), git.DiffOptions{Repo: repo, File: p})
	switch {
	case errdefs.IsNotFound(err) || errors.Is(err, errdefs.ErrFailedPrecondition):
		writeJSON(w, http.StatusOK, gitDiff{})
		return
	case err != nil:
		h.fail(w, r, err)
		return
	case d.Binary:
		writeJSON(w, http.StatusOK, gitDiff{})
		return
	}
	writeJSON(w, http.StatusOK, gitDiff{Modified: &d.Modified, Original: &d.Original})
}

// absParam returns the query parameter path, which must be absolute.
func (h *Handler) absParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	p := r.URL.Query().Get("path")
	if p == "" || !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		h.fail(w, r, errdefs.InvalidArgument("path", "must be an absolute path, got %q", p))
		return "", false
	}
	return path.Clean(p), true
}

// closestRepo returns the nearest directory at or above p (or its parent,
// when p is not a directory) that holds .git, or "".
func closestRepo(p string) string {
	dir := p
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
		dir = filepath.Dir(p)
	}
	for {
		if _, err := os.Lstat(filepath.Join(dir, ".git")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// fail answers err with its category's status; the rest of the request
// body is read first so that clients that send it whole see the answer.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	edge.DrainBody(w, r, false)
	st := status.Convert(errgrpc.ToGRPC(err))
	code := runtime.HTTPStatusFromCode(st.Code())
	if code >= 500 {
		h.log.Warn("openhands request failed", "method", r.Method, "path", r.URL.Path, "status", code, "error", err)
	}
	writeError(w, code, err)
}

// writeError writes err's body: FastAPI's "detail" and berth's "code" and
// "message".
func writeError(w http.ResponseWriter, httpStatus int, err error) {
	st := status.Convert(errgrpc.ToGRPC(err))
	writeJSON(w, httpStatus, map[string]any{"detail": st.Message(), "code": int(st.Code()), "message": st.Message()})
}

func writeJSON(w http.ResponseWriter, httpStatus int, v any) {
	b, err := jsonMarshal(v)
	if err != nil {
		httpStatus, b = http.StatusInternalServerError, []byte(`{"detail":"encoding the answer failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(httpStatus)
	_, _ = w.Write(append(b, '\n'))
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
