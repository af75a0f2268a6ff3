// Package ohruntime serves the runtime API that OpenHands'
// APIRemoteWorkspace (openhands-workspace) speaks, over berth's leases: a
// runtime is a lease, a session id its conversation id, the runtime's URL
// the lease's route through the proxy and the session API key its lease
// token. The handler authenticates X-API-Key (the operator token or a
// client token) and calls the orchestrator's own lease service with it,
// so owner scoping, the image allowlist, limits and idempotence are the
// lease API's. docs/openhands.md describes the routes and fields.
package ohruntime

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/internal/edge"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	"github.com/berth-dev/berth/pkg/runtime"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Prefix is where the orchestrator mounts the handler: the runtime_api_url
// of APIRemoteWorkspace is http://HOST:PORT/openhands/runtime.
const Prefix = "/openhands/runtime/"

// KeyHeader carries the runtime API key (a client or the operator token).
const KeyHeader = "X-API-Key"

// SandboxPrefix is the proxy route of a lease: a runtime's url is the
// orchestrator's base URL + SandboxPrefix + lease id.
const SandboxPrefix = "/v1/sandboxes/"

// maxLogLines bounds the container log lines a failed runtime's pod_logs
// carries.
const maxLogLines = 50

// Caller is what an X-API-Key authenticates.
type Caller int

// Callers.
const (
	// Nobody: no key, a wrong key, or a lease token (the runtime API is for
	// the tokens that acquire).
	Nobody Caller = iota
	// Operator holds the operator token; its runtimes are the operator's own.
	Operator
	// Client holds a client token; its runtimes are its owner's.
	Client
)

// Config is what the handler needs from the orchestrator.
type Config struct {
	// Leases is the orchestrator's lease service (an in-process client):
	// every call carries the caller's key as its bearer token.
	Leases orchv1.LeaseServiceClient
	// Authenticate maps a key to its caller, in constant time.
	Authenticate func(key string) Caller
	// OperatorOwner is the owner the operator's acquires are recorded under
	// (its sessions are found among those).
	OperatorOwner string
	// Token returns a lease's token (the lease manager's); the handler asks
	// for it only for leases the lease service showed the caller.
	Token func(leaseID string) string
	// CheckImage applies the orchestrator's image allowlist (nil: none).
	CheckImage func(image string) error
	// Images reports local images (nil: image_exists answers 501).
	Images runtime.ImageInspector
	// DefaultResources and MaxResources are the orchestrator's: a start's
	// resource_factor scales the default CPUs and memory, up to the maximum.
	DefaultResources, MaxResources runtime.Resources
	// PauseMode is how /pause pauses: "hibernate" (the default) or "freeze".
	PauseMode string
}

// Handler serves the runtime API under Prefix.
type Handler struct {
	cfg Config
	mux *http.ServeMux
}

// New returns the handler.
func New(cfg Config) *Handler {
	if cfg.PauseMode == "" {
		cfg.PauseMode = "hibernate"
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux()}
	p := strings.TrimSuffix(Prefix, "/")
	h.mux.HandleFunc("POST "+p+"/start", h.start)
	h.mux.HandleFunc("GET "+p+"/sessions/{session_id}", h.session)
	h.mux.HandleFunc("POST "+p+"/pause", h.byRuntimeID(h.pause))
	h.mux.HandleFunc("POST "+p+"/resume", h.byRuntimeID(h.resume))
	h.mux.HandleFunc("POST "+p+"/stop", h.byRuntimeID(h.stop))
	h.mux.HandleFunc("GET "+p+"/image_exists", h.imageExists)
	return h
}

var errUnauthenticated = errdefs.Newf(errdefs.ErrUnauthenticated, "missing or invalid X-API-Key (send the operator token or a client token)")

// ServeHTTP authenticates X-API-Key before anything is read, then serves
// the route.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimSpace(r.Header.Get(KeyHeader))
	c := Nobody
	if key != "" {
		c = h.cfg.Authenticate(key)
	}
	if c == Nobody {
		if r.ContentLength >= 0 && r.ContentLength <= 64<<10 {
			edge.DrainBody(w, r, false)
		} else {
			w.Header().Set("Connection", "close")
		}
		edge.WriteError(w, errUnauthenticated)
		return
	}
	ctx := metadata.AppendToOutgoingContext(r.Context(), bearer.MetadataKey, "Bearer "+key)
	ctx = context.WithValue(ctx, callerKey{}, c)
	h.mux.ServeHTTP(w, r.WithContext(ctx))
}

type callerKey struct{}

func callerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// startRequest is the body of POST /start.
type startRequest struct {
	Image           string            `json:"image"`
	Command         json.RawMessage   `json:"command"`
	WorkingDir      string            `json:"working_dir"`
	Environment     map[string]string `json:"environment"`
	SessionID       string            `json:"session_id"`
	RunAsUser       *int64            `json:"run_as_user"`
	FSGroup         *int64            `json:"fs_group"`
	ImagePullPolicy string            `json:"image_pull_policy"`
	RuntimeClass    string            `json:"runtime_class"`
	ResourceFactor  *float64          `json:"resource_factor"`
}

// runtimeView is a runtime as /start, /sessions and the lifecycle routes
// answer it.
type runtimeView struct {
	RuntimeID     string `json:"runtime_id"`
	SessionID     string `json:"session_id"`
	URL           string `json:"url"`
	SessionAPIKey string `json:"session_api_key,omitempty"`
	Status        string `json:"status"`
	PodStatus     string `json:"pod_status"`
	RestartCount  int32  `json:"restart_count"`
	PodLogs       string `json:"pod_logs"`
}

func (h *Handler) start(w http.ResponseWriter, r *http.Request) {
	var req startRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	argv, err := parseCommand(req.Command)
	if err != nil {
		writeError(w, err)
		return
	}
	user, err := req.validate()
	if err != nil {
		writeError(w, err)
		return
	}
	if h.cfg.CheckImage != nil && req.Image != "" {
		if err := h.cfg.CheckImage(req.Image); err != nil {
			writeError(w, err)
			return
		}
	}
	ar := &orchv1.AcquireRequest{
		ConversationId: req.SessionID, Image: req.Image, Env: req.Environment, User: user,
		Resources: h.scaled(req.ResourceFactor), WorkingDir: req.WorkingDir,
	}
	if len(argv) > 0 {
		ar.App = &orchv1.App{Command: argv, WorkingDir: req.WorkingDir}
	}
	res, err := h.cfg.Leases.Acquire(r.Context(), ar)
	if err != nil {
		writeError(w, err)
		return
	}
	v := h.view(r, res.GetLease())
	v.SessionAPIKey = res.GetToken()
	writeJSON(w, v)
}

// validate checks the fields berth reads or ignores and returns the lease
// user (UID or UID:GID).
func (req *startRequest) validate() (string, error) {
	switch {
	case req.SessionID == "":
		return "", errdefs.InvalidArgument("session_id", "required")
	case req.RunAsUser != nil && *req.RunAsUser < 0 || req.RunAsUser != nil && *req.RunAsUser > 1<<31-1:
		return "", errdefs.InvalidArgument("run_as_user", "%d is not a uid", *req.RunAsUser)
	case req.FSGroup != nil && *req.FSGroup < 0 || req.FSGroup != nil && *req.FSGroup > 1<<31-1:
		return "", errdefs.InvalidArgument("fs_group", "%d is not a gid", *req.FSGroup)
	case req.FSGroup != nil && req.RunAsUser == nil:
		return "", errdefs.InvalidArgument("fs_group", "needs run_as_user")
	case req.WorkingDir != "" && !strings.HasPrefix(req.WorkingDir, "/"):
		return "", errdefs.InvalidArgument("working_dir", "%q is not absolute", req.WorkingDir)
	}
	switch req.ImagePullPolicy {
	case "", "Always", "IfNotPresent", "Never":
	default:
		return "", errdefs.InvalidArgument("image_pull_policy", "%q: want Always, IfNotPresent or Never", req.ImagePullPolicy)
	}
	if f := req.ResourceFactor; f != nil && *f != 1 && *f != 2 && *f != 4 && *f != 8 {
		return "", errdefs.InvalidArgument("resource_factor", "%g: want 1, 2, 4 or 8", *f)
	}
	if req.RunAsUser == nil {
		return "", nil
	}
	user := strconv.FormatInt(*req.RunAsUser, 10)
	if req.FSGroup != nil {
		user += ":" + strconv.FormatInt(*req.FSGroup, 10)
	}
	return user, nil
}

// scaled is the default CPUs and memory times factor, each at most its
// maximum; nil (the defaults) for no factor or 1.
func (h *Handler) scaled(factor *float64) *orchv1.Resources {
	if factor == nil || *factor <= 1 {
		return nil
	}
	d, mx := h.cfg.DefaultResources, h.cfg.MaxResources
	cpus, mem := float64(d.NanoCPUs)/1e9**factor, d.MemoryBytes*int64(*factor)
	if mx.NanoCPUs > 0 {
		cpus = min(cpus, float64(mx.NanoCPUs)/1e9)
	}
	if mx.MemoryBytes > 0 {
		mem = min(mem, mx.MemoryBytes)
	}
	return &orchv1.Resources{Cpus: cpus, MemoryBytes: mem}
}

// parseCommand reads command, a list of strings or (older clients) a
// string, which runs as /bin/sh -c STRING; nil for none (absent, null,
// empty).
func parseCommand(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if strings.TrimSpace(s) == "" {
			return nil, nil
		}
		return []string{"/bin/sh", "-c", s}, nil
	}
	var l []string
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, errdefs.InvalidArgument("command", "want a list of strings or a string")
	}
	if len(l) > 0 && l[0] == "" {
		return nil, errdefs.InvalidArgument("command", "its first argument is empty")
	}
	return l, nil
}

func (h *Handler) session(w http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("session_id")
	l, err := h.bySession(r.Context(), sid)
	if err != nil {
		writeError(w, err)
		return
	}
	v := h.view(r, l)
	if l.GetState() == orchv1.LeaseState_LEASE_STATE_READY || l.GetState() == orchv1.LeaseState_LEASE_STATE_PAUSED {
		v.SessionAPIKey = h.cfg.Token(l.GetId())
	}
	if v.PodStatus == "failed" {
		v.PodLogs = h.podLogs(r.Context(), l)
	}
	writeJSON(w, v)
}

// bySession finds the caller's lease of conversation sid: the live one,
// else the latest ended one (a session that stopped answers "stopped");
// NotFound when the caller has none.
func (h *Handler) bySession(ctx context.Context, sid string) (*orchv1.Lease, error) {
	req := &orchv1.ListLeasesRequest{ConversationId: sid, IncludeEnded: true}
	if callerOf(ctx) == Operator {
		req.Owner = h.cfg.OperatorOwner
	}
	var best *orchv1.Lease
	for {
		res, err := h.cfg.Leases.List(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, l := range res.GetLeases() {
			if best == nil || live(l) && !live(best) ||
				live(l) == live(best) && l.GetCreatedAt().AsTime().After(best.GetCreatedAt().AsTime()) {
				best = l
			}
		}
		if res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	if best == nil {
		return nil, errdefs.NotFound("session %q not found", sid)
	}
	return best, nil
}

func live(l *orchv1.Lease) bool {
	switch l.GetState() {
	case orchv1.LeaseState_LEASE_STATE_PENDING, orchv1.LeaseState_LEASE_STATE_READY, orchv1.LeaseState_LEASE_STATE_PAUSED:
		return true
	}
	return false
}

// podLogs is a failed runtime's reason and the last lines of its log.
func (h *Handler) podLogs(ctx context.Context, l *orchv1.Lease) string {
	var b strings.Builder
	b.WriteString(l.GetReason())
	st, err := h.cfg.Leases.Logs(ctx, &orchv1.LogsRequest{Id: l.GetId(), Tail: maxLogLines})
	if err != nil {
		return b.String()
	}
	for {
		e, err := st.Recv()
		if err != nil {
			return b.String()
		}
		if e.GetSource() == "transition" {
			continue
		}
		b.WriteString("\n" + e.GetText())
	}
}

// byRuntimeID decodes {runtime_id} and runs op on it.
func (h *Handler) byRuntimeID(op func(ctx context.Context, id string) (*orchv1.Lease, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			RuntimeID string `json:"runtime_id"`
		}
		if err := decode(r, &req); err != nil {
			writeError(w, err)
			return
		}
		if req.RuntimeID == "" {
			edge.WriteError(w, errdefs.InvalidArgument("runtime_id", "required"))
			return
		}
		l, err := op(r.Context(), req.RuntimeID)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, h.view(r, l))
	}
}

func (h *Handler) pause(ctx context.Context, id string) (*orchv1.Lease, error) {
	return h.cfg.Leases.Pause(ctx, &orchv1.PauseRequest{Id: id, Mode: h.cfg.PauseMode})
}

func (h *Handler) resume(ctx context.Context, id string) (*orchv1.Lease, error) {
	return h.cfg.Leases.Resume(ctx, &orchv1.ResumeRequest{Id: id})
}

func (h *Handler) stop(ctx context.Context, id string) (*orchv1.Lease, error) {
	return h.cfg.Leases.Release(ctx, &orchv1.ReleaseRequest{Id: id, Reason: "stopped through the OpenHands runtime API"})
}

func (h *Handler) imageExists(w http.ResponseWriter, r *http.Request) {
	img := r.URL.Query().Get("image")
	if img == "" {
		edge.WriteError(w, errdefs.InvalidArgument("image", "required"))
		return
	}
	if h.cfg.CheckImage != nil {
		if err := h.cfg.CheckImage(img); err != nil {
			writeError(w, err)
			return
		}
	}
	if h.cfg.Images == nil {
		edge.WriteErrorStatus(w, http.StatusNotImplemented, errdefs.Newf(errdefs.ErrFailedPrecondition, "image_exists: this orchestrator's runtime does not report images"))
		return
	}
	size, err := h.cfg.Images.ImageSize(r.Context(), img)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		writeJSON(w, map[string]any{"exists": false, "image": nil})
	case err != nil:
		writeError(w, err)
	default:
		writeJSON(w, map[string]any{"exists": true, "image": map[string]any{"image_size_bytes": size}})
	}
}

// view is l as the runtime API shows it. status: running (PENDING, READY),
// paused, stopped (RELEASING and ended); pod_status: ready, pending
// (PENDING, PAUSED: the client waits for ready), failed (FAILED), not found
// (stopped otherwise).
func (h *Handler) view(r *http.Request, l *orchv1.Lease) runtimeView {
	v := runtimeView{RuntimeID: l.GetId(), SessionID: l.GetConversationId(), URL: baseURL(r) + SandboxPrefix + l.GetId(),
		RestartCount: l.GetRestarts(), Status: "stopped", PodStatus: "not found"}
	switch l.GetState() {
	case orchv1.LeaseState_LEASE_STATE_PENDING:
		v.Status, v.PodStatus = "running", "pending"
	case orchv1.LeaseState_LEASE_STATE_READY:
		v.Status, v.PodStatus = "running", "ready"
	case orchv1.LeaseState_LEASE_STATE_PAUSED:
		v.Status, v.PodStatus = "paused", "pending"
	case orchv1.LeaseState_LEASE_STATE_FAILED:
		v.PodStatus = "failed"
	}
	return v
}

// baseURL is the orchestrator's URL as the caller reached it.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// decode reads a JSON object body; a malformed body or a field of the wrong
// type is InvalidArgument naming it. Unknown fields are ignored (clients
// add fields over versions).
func decode(r *http.Request, v any) error {
	err := json.NewDecoder(r.Body).Decode(v)
	var te *json.UnmarshalTypeError
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return errdefs.InvalidArgument(te.Field, "want %s, got JSON %s", te.Type, te.Value)
	case errors.As(err, &mbe):
		return errdefs.InvalidArgument("body", "larger than %d bytes", mbe.Limit)
	case errors.Is(err, io.EOF):
		return errdefs.InvalidArgument("body", "a JSON object is required")
	}
	return errdefs.InvalidArgument("body", "not a JSON object: %v", err)
}

// writeError writes err as the REST API does: its status and JSON body,
// with Retry-After for a RESOURCE_EXHAUSTED that carries a retry hint (a
// limit of live leases).
func writeError(w http.ResponseWriter, err error) {
	st := status.Convert(errgrpc.ToGRPC(err))
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && st.Code() == codes.ResourceExhausted {
			w.Header().Set("Retry-After", strconv.Itoa(max(int(ri.GetRetryDelay().AsDuration().Round(time.Second)/time.Second), 1)))
		}
	}
	edge.WriteJSONError(w, st)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v) // an error is a client gone away
}
