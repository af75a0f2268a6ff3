package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Health probe timeouts: a sandbox that is starting refuses connections at
// once, so short timeouts only matter for a frozen or overloaded one.
const (
	probeDialTimeout = 500 * time.Millisecond
	probeTimeout     = 2 * time.Second
)

// HealthProber probes agents' GET /healthz. Keep-alives are off: each
// sandbox is probed only until it is ready, so pooled connections would only
// pile up.
type HealthProber struct {
	c *http.Client
}

// NewHealthProber returns a prober with short timeouts and no keep-alives.
func NewHealthProber() HealthProber {
	tr := &http.Transport{
		Proxy:                 nil, // the agent is on a local bridge; never use HTTP_PROXY
		DialContext:           (&net.Dialer{Timeout: probeDialTimeout}).DialContext,
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: probeTimeout,
	}
	return HealthProber{c: &http.Client{Transport: tr, Timeout: probeTimeout}}
}

// Close releases idle connections.
func (h HealthProber) Close() { h.c.CloseIdleConnections() }

// Probe reports whether http://endpoint/healthz answers 200.
func (h HealthProber) Probe(ctx context.Context, endpoint string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+HealthPath, nil)
	if err != nil {
		return false, err
	}
	resp, err := h.c.Do(req)
	if err != nil {
		return false, err
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	resp.Body.Close()
	if resp.StatusCode == http.StatusInternalServerError {
		var h struct {
			Status string `json:"status"`
			App    struct {
				Reason string `json:"reason"`
				Output string `json:"output"`
			} `json:"app"`
		}
		if json.Unmarshal(body, &h) == nil && h.Status == appFailedStatus {
			msg := h.App.Reason
			if h.App.Output != "" {
				msg += "; its last output:\n" + h.App.Output
			}
			return false, fmt.Errorf("%w: %s", ErrAppFailed, msg)
		}
	}
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("GET %s: %s", HealthPath, resp.Status)
	}
	return true, nil
}

// appFailedStatus is the agent's /healthz status when the sandbox's app
// could not start (agent.AppFailedStatus).
const appFailedStatus = "APP_FAILED"

// ErrAppFailed is the readiness error of a sandbox whose app (Spec.App)
// could not start: WaitReady returns it at once, with the app's reason and
// last output lines. It is errdefs.ErrFailedPrecondition.
var ErrAppFailed = errdefs.Newf(errdefs.ErrFailedPrecondition, "the sandbox's app did not start")

// Readiness polling: the probe interval doubles from readyPollMin to
// readyPollMax; the backend's liveness check runs at most every
// readyCheckEvery so an agent that cannot start fails fast. A probe of an
// agent not yet listening is one refused connection, so the interval
// stays short: at 50 ms a start (and a wake from hibernate) waited 25 ms
// on average after the agent was up.
const (
	readyPollMin    = 2 * time.Millisecond
	readyPollMax    = 10 * time.Millisecond
	readyCheckEvery = 50 * time.Millisecond
)

// WaitReady probes http://endpoint/healthz until it answers 200, alive
// returns an error (the sandbox exited: that error is returned), or ctx
// ends.
func (h HealthProber) WaitReady(ctx context.Context, endpoint string, alive func(context.Context) error) error {
	delay := readyPollMin
	lastCheck := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastErr error
	for {
		select {
		case <-ctx.Done():
			if lastErr == nil {
				lastErr = ctx.Err()
			}
			return fmt.Errorf("agent at %s not ready: %w (last probe: %v)", endpoint, ctx.Err(), lastErr)
		case <-timer.C:
		}
		ok, err := h.Probe(ctx, endpoint)
		if ok {
			return nil
		}
		lastErr = err
		if errors.Is(err, ErrAppFailed) {
			return err
		}
		if time.Since(lastCheck) >= readyCheckEvery {
			lastCheck = time.Now()
			if err := alive(ctx); err != nil {
				return err
			}
		}
		timer.Reset(delay)
		delay = min(delay*2, readyPollMax)
	}
}
