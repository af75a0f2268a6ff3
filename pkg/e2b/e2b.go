// Package e2b serves the subset of E2B's control-plane REST API that E2B's
// SDKs call (e2b-dev/infra spec/openapi.yml) over berth's leases, and the
// sandboxes' traffic (envd and other ports) on the same listener, so code
// written for E2B runs against berth by changing environment variables.
//
// A sandbox is a lease: its sandboxID is the lease id, templateID names an
// image through the operator's aliases, metadata is the lease's labels,
// timeout its TTL, envVars its env, autoPause its idle policy and
// allow_internet_access false its network mode none. The handler
// authenticates X-API-Key (the operator token or a client token) and calls
// the orchestrator's own lease service with it, so owner scoping, the image
// allowlist, limits and idempotence are the lease API's. A secure
// sandbox's envdAccessToken is its lease token; the traffic routes
// (traffic.go) check it against the sandbox they route to and give the
// agent its own token instead. docs/e2b.md describes the routes.
package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/agent/envd"
	"github.com/berth-dev/berth/pkg/bearer"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	gwruntime "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// KeyHeader carries the API key (a client or the operator token).
const KeyHeader = "X-API-Key"

// Labels berth keeps on a sandbox's lease (hidden from its metadata; a
// create may not set them).
const (
	// LabelPrefix is the prefix of the reserved labels.
	LabelPrefix = "e2b.berth.dev/"
	// LabelTemplate holds the templateID; a lease without it was not made
	// through this API and is no sandbox here.
	LabelTemplate = LabelPrefix + "template"
	// LabelSecure is "true" for a secure sandbox (its envd needs the
	// envdAccessToken).
	LabelSecure = LabelPrefix + "secure"
)

// EnvdVersion is the envdVersion of every sandbox: the version of E2B's
// envd whose protocol berth's agent serves.
const EnvdVersion = envd.Version

// DefaultTemplates are the template aliases when the operator sets none
// for a name: base is berth/e2b, berth's base image with E2B's
// base-template conventions (user `user`, /home/user; images/build.sh).
var DefaultTemplates = map[string]string{"base": "berth/e2b"}

// Caller is what an X-API-Key authenticates.
type Caller int

// Callers.
const (
	// Nobody: no key, a wrong key, or a lease token.
	Nobody Caller = iota
	// Operator holds the operator token; its sandboxes are the operator's own.
	Operator
	// Client holds a client token; its sandboxes are its owner's.
	Client
)

// Config is what the handler needs from the orchestrator.
type Config struct {
	// Leases is the orchestrator's lease service (an in-process client):
	// every call carries the caller's key as its bearer token.
	Leases orchv1.LeaseServiceClient
	// Authenticate maps a key to its caller, in constant time.
	Authenticate func(key string) Caller
	// OperatorOwner is the owner the operator's acquires are recorded under.
	OperatorOwner string
	// Token returns a lease's token (the lease manager's); the handler asks
	// for it only for leases the lease service showed the caller.
	Token func(leaseID string) string
	// Templates maps a templateID to an image; DefaultTemplates fill in
	// the names it lacks.
	Templates map[string]string
	// Domain is the sandboxes' domain: the SDK reaches port P of sandbox S
	// at host P-S.Domain. Empty: no domain (clients use the
	// E2b-Sandbox-Id header, E2B_SANDBOX_URL).
	Domain string
	// PauseMode is how /pause and autoPause pause: "freeze" (default;
	// processes and memory stay, like E2B's pause) or "hibernate".
	PauseMode string
	// Traffic serves the sandboxes' traffic (traffic.go); nil answers
	// every sandbox as not found.
	Traffic *Traffic
	// Logger receives failures. Default slog.Default().
	Logger *slog.Logger
}

// Handler serves the API and the traffic. Create it with New.
type Handler struct {
	cfg       Config
	mux       *http.ServeMux
	templates map[string]string
	domain    string
	log       *slog.Logger
}

// New returns the handler.
func New(cfg Config) *Handler {
	if cfg.PauseMode == "" {
		cfg.PauseMode = "freeze"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Handler{cfg: cfg, mux: http.NewServeMux(), templates: map[string]string{}, log: cfg.Logger,
		domain: strings.Trim(strings.ToLower(cfg.Domain), ".")}
	for k, v := range DefaultTemplates {
		h.templates[k] = v
	}
	for k, v := range cfg.Templates {
		h.templates[k] = v
	}
	h.mux.HandleFunc("POST /sandboxes", h.create)
	h.mux.HandleFunc("GET /sandboxes", h.listV1)
	h.mux.HandleFunc("GET /v2/sandboxes", h.listV2)
	h.mux.HandleFunc("GET /sandboxes/{id}", h.get)
	h.mux.HandleFunc("DELETE /sandboxes/{id}", h.kill)
	h.mux.HandleFunc("POST /sandboxes/{id}/connect", h.connect)
	h.mux.HandleFunc("POST /sandboxes/{id}/pause", h.pause)
	h.mux.HandleFunc("POST /sandboxes/{id}/resume", h.resume)
	h.mux.HandleFunc("POST /sandboxes/{id}/timeout", h.timeout)
	h.mux.HandleFunc("POST /sandboxes/{id}/refreshes", h.refresh)
	h.mux.HandleFunc("GET /sandboxes/{id}/metrics", h.metrics)
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path+" (berth serves a subset of E2B's API: docs/e2b.md)")
	})
	return h
}

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

// ServeHTTP routes sandbox traffic (the E2b-Sandbox-Id header, or a host
// PORT-ID.Domain) to the sandbox and anything else to the API, which
// authenticates X-API-Key before anything is read (GET /health excepted).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, port, ok := h.trafficRoute(r); ok {
		h.cfg.Traffic.serve(w, r, id, port)
		return
	}
	if r.URL.Path == "/health" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	key := strings.TrimSpace(r.Header.Get(KeyHeader))
	c := Nobody
	if key != "" {
		c = h.cfg.Authenticate(key)
	}
	if c == Nobody {
		if r.ContentLength >= 0 && r.ContentLength <= 64<<10 {
			_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 64<<10))
		} else {
			w.Header().Set("Connection", "close")
		}
		writeError(w, http.StatusUnauthorized, "missing or invalid "+KeyHeader+" (send the operator token or a berth client token)")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	ctx := metadata.AppendToOutgoingContext(r.Context(), bearer.MetadataKey, "Bearer "+key)
	ctx = context.WithValue(ctx, callerKey{}, c)
	h.mux.ServeHTTP(w, r.WithContext(ctx))
}

type callerKey struct{}

func callerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// newSandbox is the body of POST /sandboxes (NewSandbox).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	Secure              bool              `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Network             *struct {
		AllowOut []string `json:"allowOut"`
		DenyOut  []string `json:"denyOut"`
	} `json:"network"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
}

// sandbox is E2B's Sandbox (create, connect, resume).
type sandbox struct {
	TemplateID      string  `json:"templateID"`
	SandboxID       string  `json:"sandboxID"`
	Alias           string  `json:"alias,omitempty"`
	ClientID        string  `json:"clientID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken,omitempty"`
	Domain          *string `json:"domain"`
}

// clientID is every sandbox's clientID (deprecated in E2B's API).
const clientID = "berth"

func (h *Handler) create(w http.ResponseWriter, r *http.Request) {
	var req newSandbox
	if err := decode(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	ar, err := h.acquireRequest(&req)
	if err != nil {
		writeErr(w, err)
		return
	}
	res, err := h.cfg.Leases.Acquire(r.Context(), ar)
	if err != nil {
		writeErr(w, err)
		return
	}
	sb := h.sandbox(res.GetLease())
	if req.Secure {
		sb.EnvdAccessToken = res.GetToken()
	}
	writeJSON(w, http.StatusCreated, sb)
}

// acquireRequest maps a NewSandbox to the lease service's request.
func (h *Handler) acquireRequest(req *newSandbox) (*orchv1.AcquireRequest, error) {
	if req.TemplateID == "" {
		return nil, errdefs.InvalidArgument("templateID", "required")
	}
	image, ok := h.templates[req.TemplateID]
	if !ok {
		names := make([]string, 0, len(h.templates))
		for k := range h.templates {
			names = append(names, k)
		}
		slices.Sort(names)
		return nil, errdefs.InvalidArgument("templateID", "unknown template %q (this server's: %s)", req.TemplateID, strings.Join(names, ", "))
	}
	if req.Timeout != nil && *req.Timeout < 0 {
		return nil, errdefs.InvalidArgument("timeout", "%d is negative", *req.Timeout)
	}
	if req.Network != nil && (len(req.Network.AllowOut) > 0 || len(req.Network.DenyOut) > 0) {
		return nil, errdefs.InvalidArgument("network", "allowOut and denyOut are not served (allow_internet_access is)")
	}
	if len(req.VolumeMounts) > 0 {
		return nil, errdefs.InvalidArgument("volumeMounts", "volumes are not served")
	}
	labels := map[string]string{LabelTemplate: req.TemplateID, LabelSecure: strconv.FormatBool(req.Secure)}
	for k, v := range req.Metadata {
		if strings.HasPrefix(k, LabelPrefix) {
			return nil, errdefs.InvalidArgument("metadata", "the key %q is reserved", k)
		}
		labels[k] = v
	}
	ar := &orchv1.AcquireRequest{
		ConversationId: "e2b-" + randomHex(8), Image: image, Labels: labels, Env: req.EnvVars,
	}
	if req.Timeout != nil && *req.Timeout > 0 {
		ttl := durationpb.New(time.Duration(*req.Timeout) * time.Second)
		if req.AutoPause {
			// The sandbox pauses after timeout seconds without traffic
			// rather than ending: the lease's idle policy.
			ar.IdleTimeout, ar.IdlePolicy = ttl, h.cfg.PauseMode
		} else {
			ar.Ttl = ttl
		}
	} else if req.AutoPause {
		ar.IdlePolicy = h.cfg.PauseMode
	}
	if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
		ar.Network = &orchv1.NetworkPolicy{Mode: "none"}
	}
	return ar, nil
}

// sandbox is l as Sandbox.
func (h *Handler) sandbox(l *orchv1.Lease) sandbox {
	sb := sandbox{TemplateID: l.GetLabels()[LabelTemplate], SandboxID: l.GetId(), ClientID: clientID, EnvdVersion: EnvdVersion}
	sb.Alias = sb.TemplateID
	if h.domain != "" {
		d := h.domain
		sb.Domain = &d
	}
	return sb
}

// listedSandbox is E2B's ListedSandbox; sandboxDetail adds a few fields.
type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int32             `json:"cpuCount"`
	MemoryMB    int32             `json:"memoryMB"`
	DiskSizeMB  int32             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string  `json:"envdAccessToken,omitempty"`
	Domain              *string `json:"domain"`
	AllowInternetAccess *bool   `json:"allowInternetAccess"`
}

// stateOf is l's E2B state: running (PENDING, READY), paused, or "" for
// a lease that is no sandbox (ending, ended).
func stateOf(l *orchv1.Lease) string {
	switch l.GetState() {
	case orchv1.LeaseState_LEASE_STATE_PENDING, orchv1.LeaseState_LEASE_STATE_READY:
		return "running"
	case orchv1.LeaseState_LEASE_STATE_PAUSED:
		return "paused"
	}
	return ""
}

func (h *Handler) listed(l *orchv1.Lease) listedSandbox {
	md := map[string]string{}
	for k, v := range l.GetLabels() {
		if !strings.HasPrefix(k, LabelPrefix) {
			md[k] = v
		}
	}
	res := l.GetResources()
	ls := listedSandbox{
		TemplateID: l.GetLabels()[LabelTemplate], SandboxID: l.GetId(), ClientID: clientID,
		StartedAt: l.GetCreatedAt().AsTime().UTC(), EndAt: l.GetExpiresAt().AsTime().UTC(),
		CPUCount: max(int32(res.GetCpus()+0.999), 1), MemoryMB: int32(res.GetMemoryBytes() >> 20),
		DiskSizeMB: int32(res.GetDiskBytes() >> 20), Metadata: md, State: stateOf(l), EnvdVersion: EnvdVersion,
	}
	ls.Alias = ls.TemplateID
	return ls
}

// isSandbox reports whether l was made through this API and is live.
func isSandbox(l *orchv1.Lease) bool {
	_, ok := l.GetLabels()[LabelTemplate]
	return ok && stateOf(l) != ""
}

// listQuery is a list's filter.
type listQuery struct {
	metadata map[string]string
	states   []string
}

func (q listQuery) match(l *orchv1.Lease) bool {
	if !isSandbox(l) || !slices.Contains(q.states, stateOf(l)) {
		return false
	}
	for k, v := range q.metadata {
		if got, ok := l.GetLabels()[k]; !ok || got != v || strings.HasPrefix(k, LabelPrefix) {
			return false
		}
	}
	return true
}

// parseMetadata reads the metadata query parameter: one URL-encoded
// "k=v&k2=v2" string.
func parseMetadata(q url.Values) (map[string]string, error) {
	raw := q.Get("metadata")
	if raw == "" {
		return nil, nil
	}
	vs, err := url.ParseQuery(raw)
	if err != nil {
		return nil, errdefs.InvalidArgument("metadata", "not a URL-encoded k=v&... query: %v", err)
	}
	md := map[string]string{}
	for k, v := range vs {
		md[k] = v[len(v)-1]
	}
	return md, nil
}

func (h *Handler) listRequest(ctx context.Context) *orchv1.ListLeasesRequest {
	req := &orchv1.ListLeasesRequest{}
	if callerOf(ctx) == Operator {
		req.Owner = h.cfg.OperatorOwner
	}
	return req
}

// listV1 is GET /sandboxes: every running sandbox of the caller.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := parseMetadata(r.URL.Query())
	if err != nil {
		writeErr(w, err)
		return
	}
	q := listQuery{metadata: md, states: []string{"running"}}
	req := h.listRequest(r.Context())
	req.PageSize = 1000
	out := []listedSandbox{}
	for {
		res, err := h.cfg.Leases.List(r.Context(), req)
		if err != nil {
			writeErr(w, err)
			return
		}
		for _, l := range res.GetLeases() {
			if q.match(l) {
				out = append(out, h.listed(l))
			}
		}
		if res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	writeJSON(w, http.StatusOK, out)
}

// NextTokenHeader carries the cursor of the next page of GET /v2/sandboxes.
const NextTokenHeader = "X-Next-Token"

// listV2 is GET /v2/sandboxes: one page (limit, nextToken) of the
// caller's sandboxes in the states asked for (default running).
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	md, err := parseMetadata(qv)
	if err != nil {
		writeErr(w, err)
		return
	}
	q := listQuery{metadata: md}
	for _, v := range qv["state"] {
		for s := range strings.SplitSeq(v, ",") {
			switch s = strings.TrimSpace(s); s {
			case "running", "paused":
				q.states = append(q.states, s)
			case "":
			default:
				writeErr(w, errdefs.InvalidArgument("state", "%q: want running or paused", s))
				return
			}
		}
	}
	if len(q.states) == 0 {
		q.states = []string{"running", "paused"}
	}
	limit := 100
	if v := qv.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeErr(w, errdefs.InvalidArgument("limit", "%q: want 1-100", v))
			return
		}
		limit = n
	}
	req := h.listRequest(r.Context())
	req.PageSize, req.PageToken = int32(limit), qv.Get("nextToken")
	res, err := h.cfg.Leases.List(r.Context(), req)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []listedSandbox{}
	for _, l := range res.GetLeases() {
		if q.match(l) {
			out = append(out, h.listed(l))
		}
	}
	if next := res.GetNextPageToken(); next != "" {
		w.Header().Set(NextTokenHeader, next)
	}
	writeJSON(w, http.StatusOK, out)
}

// lookup returns the caller's sandbox named by the path: 404 for no such
// lease, another owner's, one not made through this API, or one ended.
func (h *Handler) lookup(r *http.Request) (*orchv1.Lease, error) {
	id := r.PathValue("id")
	l, err := h.cfg.Leases.Get(r.Context(), &orchv1.GetLeaseRequest{Id: id})
	switch c := status.Code(err); {
	case c == codes.NotFound || c == codes.PermissionDenied || c == codes.InvalidArgument:
		return nil, notFound(id)
	case err != nil:
		return nil, err
	case !isSandbox(l):
		return nil, notFound(id)
	}
	return l, nil
}

func notFound(id string) error { return errdefs.NotFound("sandbox %q not found", id) }

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	d := sandboxDetail{listedSandbox: h.listed(l)}
	if h.domain != "" {
		dom := h.domain
		d.Domain = &dom
	}
	if l.GetNetwork().GetMode() == "none" {
		f := false
		d.AllowInternetAccess = &f
	}
	if l.GetLabels()[LabelSecure] == "true" {
		d.EnvdAccessToken = h.cfg.Token(l.GetId())
	}
	writeJSON(w, http.StatusOK, d)
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) {
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if _, err := h.cfg.Leases.Release(r.Context(), &orchv1.ReleaseRequest{Id: l.GetId(), Reason: "killed through the E2B API"}); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request) {
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if l.GetState() != orchv1.LeaseState_LEASE_STATE_READY {
		writeError(w, http.StatusConflict, "sandbox "+l.GetId()+" is not running ("+stateOf(l)+")")
		return
	}
	if _, err := h.cfg.Leases.Pause(r.Context(), &orchv1.PauseRequest{Id: l.GetId(), Mode: h.cfg.PauseMode}); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is the body of /connect, /resume and /timeout.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// resume is POST /resume: 201 and the sandbox when it was paused, 409
// when it runs.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decodeOptional(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if l.GetState() != orchv1.LeaseState_LEASE_STATE_PAUSED {
		writeError(w, http.StatusConflict, "sandbox "+l.GetId()+" is already running")
		return
	}
	h.resumeAndAnswer(w, r, l, body.Timeout, false)
}

// connect is POST /connect: the sandbox, resumed first when paused (201,
// else 200), its deadline extended to timeout seconds from now (never
// shortened).
func (h *Handler) connect(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decodeOptional(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if l.GetState() == orchv1.LeaseState_LEASE_STATE_PAUSED {
		h.resumeAndAnswer(w, r, l, body.Timeout, true)
		return
	}
	if l, err = h.extend(r.Context(), l, body.Timeout); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, h.withToken(l))
}

func (h *Handler) resumeAndAnswer(w http.ResponseWriter, r *http.Request, l *orchv1.Lease, timeout *int64, onlyExtend bool) {
	l, err := h.cfg.Leases.Resume(r.Context(), &orchv1.ResumeRequest{Id: l.GetId()})
	if err != nil {
		writeErr(w, err)
		return
	}
	if onlyExtend {
		l, err = h.extend(r.Context(), l, timeout)
	} else if timeout != nil && *timeout > 0 {
		l, err = h.cfg.Leases.Renew(r.Context(), &orchv1.RenewRequest{Id: l.GetId(), Ttl: durationpb.New(time.Duration(*timeout) * time.Second)})
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, h.withToken(l))
}

// withToken is l as Sandbox with the envdAccessToken of a secure sandbox.
func (h *Handler) withToken(l *orchv1.Lease) sandbox {
	sb := h.sandbox(l)
	if l.GetLabels()[LabelSecure] == "true" {
		sb.EnvdAccessToken = h.cfg.Token(l.GetId())
	}
	return sb
}

// extend moves l's deadline to seconds from now when that is later than
// its deadline; nil or 0 leaves it.
func (h *Handler) extend(ctx context.Context, l *orchv1.Lease, seconds *int64) (*orchv1.Lease, error) {
	if seconds == nil || *seconds <= 0 {
		return l, nil
	}
	d := time.Duration(*seconds) * time.Second
	if !time.Now().Add(d).After(l.GetExpiresAt().AsTime()) {
		return l, nil
	}
	return h.cfg.Leases.Renew(ctx, &orchv1.RenewRequest{Id: l.GetId(), Ttl: durationpb.New(d)})
}

// timeout is POST /timeout: the sandbox ends timeout seconds from now,
// sooner or later than before.
func (h *Handler) timeout(w http.ResponseWriter, r *http.Request) {
	var body timeoutBody
	if err := decode(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	if body.Timeout == nil || *body.Timeout < 0 {
		writeErr(w, errdefs.InvalidArgument("timeout", "required, seconds from now (0 or more)"))
		return
	}
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	ttl := time.Duration(*body.Timeout) * time.Second
	if ttl == 0 {
		ttl = time.Second // Renew reads 0 as the lease's own ttl
	}
	if _, err := h.cfg.Leases.Renew(r.Context(), &orchv1.RenewRequest{Id: l.GetId(), Ttl: durationpb.New(ttl)}); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh is POST /refreshes: the sandbox lives at least duration seconds
// (at most 3600) more.
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := decodeOptional(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	if d := body.Duration; d != nil && (*d < 0 || *d > 3600) {
		writeErr(w, errdefs.InvalidArgument("duration", "%d: want 0-3600 seconds", *d))
		return
	}
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	if _, err := h.extend(r.Context(), l, body.Duration); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int32     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics is GET /metrics: the lease's last usage sample (berth keeps no
// history), or none yet.
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) {
	l, err := h.lookup(r)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []sandboxMetric{}
	if u := l.GetUsage(); u != nil && u.GetSampledAt() != nil {
		at := u.GetSampledAt().AsTime().UTC()
		res := l.GetResources()
		memTotal := u.GetMemoryLimitBytes()
		if memTotal == 0 {
			memTotal = res.GetMemoryBytes()
		}
		out = append(out, sandboxMetric{
			Timestamp: at, TimestampUnix: at.Unix(), CPUCount: max(int32(res.GetCpus()+0.999), 1),
			CPUUsedPct: u.GetCpuPercent(), MemUsed: u.GetMemoryBytes(), MemTotal: memTotal,
			DiskUsed: u.GetDiskBytes(), DiskTotal: res.GetDiskBytes(),
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// decode reads a JSON object body; a malformed body or a field of the
// wrong type is InvalidArgument naming it. Unknown fields are ignored.
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

// decodeOptional is decode for a body that may be empty (or JSON null).
func decodeOptional(r *http.Request, v any) error {
	b, err := io.ReadAll(r.Body)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errdefs.InvalidArgument("body", "larger than %d bytes", mbe.Limit)
	case err != nil:
		return errdefs.InvalidArgument("body", "reading it: %v", err)
	case len(strings.TrimSpace(string(b))) == 0:
		return nil
	}
	r.Body = io.NopCloser(strings.NewReader(string(b)))
	return decode(r, v)
}

// apiError is E2B's Error: the HTTP status as code, and a message.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, httpStatus int, msg string) {
	writeJSON(w, httpStatus, apiError{Code: httpStatus, Message: msg})
}

// writeErr writes err (an errdefs category or a gRPC status) with the
// HTTP status grpc-gateway gives its code.
func writeErr(w http.ResponseWriter, err error) {
	st := status.Convert(errgrpc.ToGRPC(err))
	writeError(w, gwruntime.HTTPStatusFromCode(st.Code()), st.Message())
}

func writeJSON(w http.ResponseWriter, httpStatus int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	_ = json.NewEncoder(w).Encode(v) // an error is a client gone away
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// decodeString is decode for a string (tests).
func decodeString(s string, v any) error {
	r, _ := http.NewRequest(http.MethodPost, "/", strings.NewReader(s))
	return decode(r, v)
}
