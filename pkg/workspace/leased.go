package workspace

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Defaults of LeasedConfig.
const (
	// DefaultOrchestratorAddr is the orchestrator's default address.
	DefaultOrchestratorAddr = "http://127.0.0.1:7070"
	// DefaultReleaseTimeout bounds the release in Close.
	DefaultReleaseTimeout = 30 * time.Second
	// minRenewEvery keeps a tiny TTL from spinning the renewal loop.
	minRenewEvery = 50 * time.Millisecond
	// firstRetry is the first wait after a failed renewal; it doubles up to
	// the renewal interval.
	firstRetry = 250 * time.Millisecond
)

// LeasedConfig configures NewLeased.
type LeasedConfig struct {
	// OrchestratorAddr is the orchestrator: "host:port" or an http(s) URL.
	// Default "http://127.0.0.1:7070".
	OrchestratorAddr string
	// Token authenticates the lease API calls (acquire, renew, release): a
	// client token or the operator token. Required. The workspace's own
	// calls go through the proxy with the lease token that acquire returns.
	Token string
	// ConversationID names the conversation. Acquire is idempotent by it:
	// while the conversation's lease is live, every NewLeased with the same
	// id (a retry, a restarted client) gets that same lease. Required.
	ConversationID string
	// Image is the sandbox image; default the orchestrator's (berth/base).
	// Ignored when an existing lease is picked up.
	Image string
	// TTL is the lease's lifetime, set at acquire and at every renewal;
	// default the orchestrator's default TTL (and, for a picked-up lease,
	// the TTL it already has).
	TTL time.Duration
	// IdleTimeout expires the lease after this long without traffic;
	// default the orchestrator's (which may be none).
	IdleTimeout time.Duration
	// Labels are attached to a new lease.
	Labels map[string]string
	// RenewEvery is the interval of the background renewals; default a
	// third of the TTL. A failed renewal is retried sooner (from 250ms,
	// doubling up to RenewEvery).
	RenewEvery time.Duration
	// Transport is the wire protocol of both the lease API and the
	// workspace (through the proxy); default TransportGRPC.
	Transport Transport
	// KeepOnClose leaves the lease alive on Close (it still expires after
	// its TTL unless renewed), so that a later NewLeased with the same
	// ConversationID, in this process or another, picks it up.
	KeepOnClose bool
	// ReleaseTimeout bounds the release in Close; default 30s.
	ReleaseTimeout time.Duration
	// TLSConfig is used for an https OrchestratorAddr.
	TLSConfig *tls.Config
	// HTTPClient sends REST requests; see RemoteConfig.HTTPClient.
	HTTPClient *http.Client
	// Logger receives renewal failures and the lease's end; default
	// slog.Default().
	Logger *slog.Logger

	// direct, when set (by tests), builds the Remote from the acquired
	// lease instead of going through the proxy.
	direct func(resp *orchv1.AcquireResponse) RemoteConfig
}

// LeaseInfo describes the lease behind a Leased workspace.
type LeaseInfo struct {
	// ID is the lease id.
	ID string
	// Token is the lease token: it opens the lease's sandbox through the
	// proxy and may renew or release the lease. Keep it secret.
	Token string
	// ConversationID is the conversation the lease belongs to.
	ConversationID string
	// Created is true when NewLeased created the lease, false when it
	// picked up the conversation's live lease.
	Created bool
	// ExpiresAt is the expiry as of the last successful acquire or renewal.
	ExpiresAt time.Time
}

// Leased is a Workspace in a sandbox leased from the orchestrator for one
// conversation. It works through the orchestrator's proxy (a Remote with
// the lease token), renews the lease in the background while it is open,
// and releases it on Close (unless KeepOnClose). Create it with NewLeased.
//
// When a renewal finds the lease ended (FAILED_PRECONDITION: expired,
// released, failed) or gone (NOT_FOUND), renewing stops and every later
// call fails with an error matching ErrLeaseLost (and
// errdefs.ErrFailedPrecondition) that says why; Err returns it. Other
// renewal failures (the orchestrator unreachable, a timeout) are logged and
// retried.
type Leased struct {
	cfg    LeasedConfig
	api    leaseAPI
	remote *Remote
	log    *slog.Logger
	every  time.Duration

	lifetime context.Context
	stop     context.CancelFunc
	done     chan struct{}

	mu    sync.Mutex
	lease LeaseInfo
	lost  error

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ Workspace = (*Leased)(nil)

// leaseLostError is the error of calls on a Leased workspace whose lease
// ended.
type leaseLostError struct {
	id    string
	cause error
}

func (e *leaseLostError) Error() string {
	return fmt.Sprintf("workspace: lease %s is no longer usable: %v", e.id, e.cause)
}

func (e *leaseLostError) Unwrap() []error {
	return []error{ErrLeaseLost, errdefs.ErrFailedPrecondition}
}

// NewLeased acquires the lease of cfg.ConversationID (creating its sandbox,
// or picking up the conversation's live lease), connects to the sandbox
// through the orchestrator's proxy and starts renewing the lease. ctx
// bounds the setup only; the renewals live until Close.
//
// If the sandbox cannot be reached after the acquire, a lease this call
// created is released again (unless KeepOnClose); a picked-up lease is
// left alone.
func NewLeased(ctx context.Context, cfg LeasedConfig) (*Leased, error) {
	switch {
	case cfg.ConversationID == "":
		return nil, errdefs.InvalidArgument("conversation_id", "required")
	case cfg.Token == "":
		return nil, errdefs.InvalidArgument("token", "required: a client or operator token of the orchestrator")
	case cfg.TTL < 0:
		return nil, errdefs.InvalidArgument("ttl", "must not be negative, got %s", cfg.TTL)
	case cfg.RenewEvery < 0:
		return nil, errdefs.InvalidArgument("renew_every", "must not be negative, got %s", cfg.RenewEvery)
	}
	if cfg.OrchestratorAddr == "" {
		cfg.OrchestratorAddr = DefaultOrchestratorAddr
	}
	if cfg.ReleaseTimeout <= 0 {
		cfg.ReleaseTimeout = DefaultReleaseTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	api, err := newLeaseAPI(cfg)
	if err != nil {
		return nil, err
	}
	req := &orchv1.AcquireRequest{
		ConversationId: cfg.ConversationID, Image: cfg.Image, Ttl: ttlProto(cfg.TTL),
		IdleTimeout: ttlProto(cfg.IdleTimeout), Labels: cfg.Labels,
	}
	resp, err := api.Acquire(ctx, req)
	if err != nil {
		api.Close()
		return nil, fmt.Errorf("workspace: acquire a lease for conversation %q: %w", cfg.ConversationID, err)
	}
	lease := resp.GetLease()
	log := cfg.Logger.With("component", "workspace", "lease_id", lease.GetId(), "conversation_id", cfg.ConversationID)
	l := &Leased{
		cfg: cfg, api: api, log: log, done: make(chan struct{}),
		lease: LeaseInfo{
			ID: lease.GetId(), Token: resp.GetToken(), ConversationID: cfg.ConversationID,
			Created: resp.GetCreated(), ExpiresAt: lease.GetExpiresAt().AsTime(),
		},
	}
	fail := func(err error) (*Leased, error) {
		if resp.GetCreated() && !cfg.KeepOnClose {
			l.release("abandoned: the workspace could not be set up")
		}
		api.Close()
		return nil, err
	}
	if st := lease.GetState(); st != orchv1.LeaseState_LEASE_STATE_READY {
		return fail(errdefs.FailedPrecondition("lease %s is %s: %s", lease.GetId(), st, lease.GetReason()))
	}

	rc := RemoteConfig{
		Target: cfg.OrchestratorAddr, Token: resp.GetToken(), LeaseID: lease.GetId(), Transport: cfg.Transport,
		TLSConfig: cfg.TLSConfig, HTTPClient: cfg.HTTPClient, Logger: cfg.Logger,
	}
	if cfg.direct != nil {
		rc = cfg.direct(resp)
	}
	l.remote, err = NewRemote(ctx, rc)
	if err != nil {
		return fail(fmt.Errorf("workspace: lease %s: %w", lease.GetId(), err))
	}

	ttl := cfg.TTL
	if ttl == 0 {
		ttl = lease.GetTtl().AsDuration()
	}
	l.every = cfg.RenewEvery
	if l.every == 0 {
		l.every = ttl / 3
	}
	if l.every == 0 {
		l.every = time.Minute
	}
	l.every = max(l.every, minRenewEvery)
	l.lifetime, l.stop = context.WithCancel(context.WithoutCancel(ctx))
	go l.renewLoop(l.lifetime)
	log.Debug("leased workspace ready", "created", resp.GetCreated(), "root", l.remote.Root(), "renew_every", l.every)
	return l, nil
}

// Lease returns the lease: id, token, and expiry as of the last renewal.
func (l *Leased) Lease() LeaseInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease
}

// LeaseID returns the lease id.
func (l *Leased) LeaseID() string { return l.Lease().ID }

// LeaseToken returns the lease token.
func (l *Leased) LeaseToken() string { return l.Lease().Token }

// Err returns the error that ended the lease (matching ErrLeaseLost), or
// nil while the lease is usable.
func (l *Leased) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// renewLoop renews the lease every l.every until ctx ends or the lease is
// lost.
func (l *Leased) renewLoop(ctx context.Context) {
	defer close(l.done)
	id := l.LeaseID()
	timeout := min(max(l.every, 2*time.Second), 30*time.Second)
	retry := min(firstRetry, l.every)
	timer := time.NewTimer(l.every)
	defer timer.Stop()
	for failures := 0; ; {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		lease, err := l.api.Renew(rctx, id, l.cfg.TTL)
		cancel()
		switch {
		case err == nil:
			l.mu.Lock()
			l.lease.ExpiresAt = lease.GetExpiresAt().AsTime()
			l.mu.Unlock()
			if failures > 0 {
				l.log.Info("lease renewal recovered", "failures", failures)
			}
			failures, retry = 0, min(firstRetry, l.every)
			timer.Reset(l.every)
		case ctx.Err() != nil:
			return
		case isCategory(err, errdefs.ErrFailedPrecondition, errdefs.ErrNotFound):
			l.mu.Lock()
			l.lost = &leaseLostError{id: id, cause: err}
			l.mu.Unlock()
			l.log.Error("lease lost; the workspace is no longer usable", "error", err)
			return
		default:
			failures++
			l.log.Warn("lease renewal failed; retrying", "error", err, "failures", failures, "retry_in", retry)
			timer.Reset(retry)
			retry = min(2*retry, l.every)
		}
	}
}

// release releases the lease, bounded by ReleaseTimeout, even when the
// lifetime is over.
func (l *Leased) release(reason string) error {
	base := l.lifetime
	if base == nil {
		base = context.Background()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(base), l.cfg.ReleaseTimeout)
	defer cancel()
	id := l.LeaseID()
	if _, err := l.api.Release(ctx, id, reason); err != nil {
		l.log.Warn("lease release failed", "error", err)
		return fmt.Errorf("workspace: release lease %s: %w", id, err)
	}
	l.log.Debug("lease released")
	return nil
}

// Close stops the renewals, closes the connection to the sandbox and
// releases the lease (unless KeepOnClose, or the lease is already lost),
// waiting up to ReleaseTimeout. It returns the release's error. Later
// calls fail with ErrClosed.
func (l *Leased) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.stop()
		<-l.done
		errs := []error{l.remote.Close()}
		if !l.cfg.KeepOnClose && l.Err() == nil {
			errs = append(errs, l.release("released by the workspace's Close"))
		}
		l.closeErr = errors.Join(append(errs, l.api.Close())...)
	})
	return l.closeErr
}

// check refuses calls on a closed workspace or a lost lease.
func (l *Leased) check() error {
	if l.closed.Load() {
		return ErrClosed
	}
	return l.Err()
}

// Root returns the sandbox's workspace directory.
func (l *Leased) Root() string { return l.remote.Root() }

// Exec runs a command in the sandbox; see Workspace.
func (l *Leased) Exec(ctx context.Context, cmd Command) (Result, error) {
	if err := l.check(); err != nil {
		return Result{}, err
	}
	return l.remote.Exec(ctx, cmd)
}

// ExecStream runs a command in the sandbox and streams its events; see
// Workspace.
func (l *Leased) ExecStream(ctx context.Context, cmd Command, fn func(Event) error) (Result, error) {
	if err := l.check(); err != nil {
		return Result{}, err
	}
	return l.remote.ExecStream(ctx, cmd, fn)
}

// Upload writes src to dst in the sandbox; see Workspace.
func (l *Leased) Upload(ctx context.Context, src io.Reader, dst string) error {
	if err := l.check(); err != nil {
		return err
	}
	return l.remote.Upload(ctx, src, dst)
}

// Download writes the sandbox's file src to dst; see Workspace.
func (l *Leased) Download(ctx context.Context, src string, dst io.Writer) error {
	if err := l.check(); err != nil {
		return err
	}
	return l.remote.Download(ctx, src, dst)
}

// Stat describes a path in the sandbox; see Workspace.
func (l *Leased) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := l.check(); err != nil {
		return FileInfo{}, err
	}
	return l.remote.Stat(ctx, path)
}

// List lists a directory in the sandbox; see Workspace.
func (l *Leased) List(ctx context.Context, path string, depth int) ([]FileInfo, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	return l.remote.List(ctx, path, depth)
}

// GitChanges returns the changed paths of a work tree in the sandbox; see
// Workspace.
func (l *Leased) GitChanges(ctx context.Context, repo string) ([]GitChange, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	return l.remote.GitChanges(ctx, repo)
}

// GitDiff returns a diff of a work tree in the sandbox; see Workspace.
func (l *Leased) GitDiff(ctx context.Context, repo, file string) (GitDiff, error) {
	if err := l.check(); err != nil {
		return GitDiff{}, err
	}
	return l.remote.GitDiff(ctx, repo, file)
}
