package workspace

import orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"

// SetDirect makes NewLeased reach the leased sandbox with the RemoteConfig
// that f builds from the acquired lease instead of going through the
// orchestrator's proxy (for tests that run before the proxy is mounted).
func SetDirect(cfg *LeasedConfig, f func(lease *orchv1.Lease) RemoteConfig) {
	cfg.direct = func(resp *orchv1.AcquireResponse) RemoteConfig { return f(resp.GetLease()) }
}
