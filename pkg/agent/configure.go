package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/berth-dev/berth/pkg/agent/mask"
	"github.com/berth-dev/berth/pkg/agent/statefile"
	"github.com/berth-dev/berth/pkg/agent/validate"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// DefaultStateFile is where sandbox-agent keeps what Configure gave it
// (root-only), so that a restarted container's agent applies it again.
const DefaultStateFile = "/var/lib/berth-agent/configure.json"

// leaseConfig is what ConfigService.Configure gives and the state file
// holds.
type leaseConfig = statefile.Config

// configurer implements ConfigService: the environment and secrets of
// the lease that claimed a pooled sandbox. Commands get the environment
// through environ (process.Config.Environ); the secrets go to the masker.
type configurer struct {
	agentv1.UnimplementedConfigServiceServer
	log       *slog.Logger
	stateFile string
	// blank is the state file, created empty and held open from the agent's
	// start (nil when it could not be): a Configure whose configuration
	// fits in one page writes it with one pwrite, no path walked, no file
	// created or renamed, while a claim waits (writeState).
	blank  *os.File
	base   map[string]string // secrets from the agent's start (Config.Secrets)
	masker *mask.Masker

	mu sync.Mutex // held while configuring
	// configured is set once the configuration is applied: Configure
	// checks it under mu, environ's check on every command without.
	configured atomic.Bool
	env        atomic.Pointer[[]string] // KEY=VALUE added to every command's environment
}

// newConfigurer returns the ConfigService of an agent whose start-up
// secrets are base, applying the state file when one is there.
func newConfigurer(stateFile string, base map[string]string, log *slog.Logger) (*configurer, error) {
	c := &configurer{log: log, stateFile: stateFile, base: base, masker: mask.NewSettable(base)}
	if stateFile == "" {
		return c, nil
	}
	b, err := os.ReadFile(stateFile)
	switch {
	case errors.Is(err, fs.ErrNotExist) || err == nil && len(b) == 0:
		// No configuration kept (an empty file is one this agent's start
		// made): the file is made and opened now, so a Configure writes
		// no directory (an overlay copy-up of /var/lib) and opens no file
		// while a claim waits. Best effort: writeState falls back to a
		// whole write.
		c.blank = openBlank(stateFile)
		c.markWatched()
		// encoding/json builds a type's encoder and decoder on their first
		// use: 0.15-0.3 ms in a fresh agent, which would fall on the
		// claim's Configure (BenchmarkConfigureCPU in cmd/sandbox-agent),
		// or on the first command after a claim through the file.
		b, _ := statefile.Encode(leaseConfig{})
		_, _ = statefile.Decode(b)
		return c, nil
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", stateFile, err)
	}
	lc, err := statefile.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", stateFile, err)
	}
	c.apply(lc)
	c.markWatched()
	log.Info("applied the lease configuration kept from before a restart", "env", len(lc.Env), "secrets", len(lc.Secrets))
	return c, nil
}

// apply makes lc the configuration. Called once.
func (c *configurer) apply(lc leaseConfig) {
	all := maps.Clone(lc.Env)
	if all == nil {
		all = map[string]string{}
	}
	maps.Copy(all, lc.Secrets)
	kv := make([]string, 0, len(all))
	for _, k := range slices.Sorted(maps.Keys(all)) {
		kv = append(kv, k+"="+all[k])
	}
	c.env.Store(&kv)
	secrets := maps.Clone(c.base)
	if secrets == nil {
		secrets = map[string]string{}
	}
	maps.Copy(secrets, lc.Secrets)
	c.masker.Set(secrets)
	c.configured.Store(true)
}

// markWatched creates statefile.Marker next to the state file when the
// agent holds the empty file open, so the orchestrator may configure it by
// writing the file (package statefile); without the file held, it removes
// a marker left by an earlier start, and the orchestrator calls Configure.
func (c *configurer) markWatched() {
	marker := filepath.Join(filepath.Dir(c.stateFile), statefile.Marker)
	if c.blank == nil || filepath.Base(c.stateFile) != statefile.Name {
		_ = os.Remove(marker)
		return
	}
	f, err := os.OpenFile(marker, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		c.log.Warn("cannot mark the state file as watched; the orchestrator will configure this agent over gRPC", "err", err)
		return
	}
	_ = f.Close()
}

// ensure applies the configuration the orchestrator wrote into (or renamed
// over) the empty state file the agent holds (statefile.WriteClaim), if it
// did and it is
// not applied yet; every command's start calls it (environ), so none runs
// without its lease's configuration. Nothing but an atomic load once
// configured; one fstat(2) per command before.
func (c *configurer) ensure() error {
	if c.configured.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ensureLocked()
}

// ensureLocked is ensure with mu held.
func (c *configurer) ensureLocked() error {
	if c.configured.Load() || c.blank == nil {
		return nil
	}
	claimed, err := statefile.Claimed(c.blank)
	if err != nil || !claimed {
		return nil
	}
	b, err := os.ReadFile(c.stateFile)
	if err == nil && len(b) == 0 {
		err = errors.New("the file is empty")
	}
	var lc leaseConfig
	if err == nil {
		lc, err = statefile.Decode(b)
	}
	if err != nil {
		// Fail the command rather than run it without its lease's
		// environment.
		return fmt.Errorf("%w: apply the lease configuration written to %s: %v", errdefs.ErrInternal, c.stateFile, err)
	}
	_ = c.blank.Close()
	c.blank = nil
	c.apply(lc)
	c.log.Debug("configured for a lease through the state file", "env", len(lc.Env), "secrets", len(lc.Secrets))
	return nil
}

// environ is the base environment of commands: the agent's own, with
// the configured variables added (and overriding).
func (c *configurer) environ() ([]string, error) {
	if err := c.ensure(); err != nil {
		return nil, err
	}
	base := os.Environ()
	p := c.env.Load()
	if p == nil {
		return base, nil
	}
	keys := make(map[string]bool, len(*p))
	for _, kv := range *p {
		k, _, _ := strings.Cut(kv, "=")
		keys[k] = true
	}
	out := make([]string, 0, len(base)+len(*p))
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !keys[k] {
			out = append(out, kv)
		}
	}
	return append(out, *p...), nil
}

// Configure implements ConfigService.Configure.
func (c *configurer) Configure(_ context.Context, req *agentv1.ConfigureRequest) (*agentv1.ConfigureResponse, error) {
	if err := validate.Env(req.GetEnv()); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if err := validate.Env(req.GetSecrets()); err != nil {
		return nil, errgrpc.ToGRPC(errdefs.InvalidArgument("secrets", "%v", err))
	}
	for k := range req.GetSecrets() {
		if _, ok := req.GetEnv()[k]; ok {
			return nil, errgrpc.ToGRPC(errdefs.InvalidArgument("secrets", "%s is also in env", k))
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ensureLocked(); err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if c.configured.Load() {
		return nil, errgrpc.ToGRPC(statefile.ErrConfigured())
	}
	lc := leaseConfig{Env: req.GetEnv(), Secrets: req.GetSecrets()}
	if c.stateFile != "" {
		// Written before the answer (without fsync): a command can only
		// start after the claim's READY answer, so every command runs with
		// the configuration already kept for a restart of the container.
		if err := c.writeState(lc); err != nil {
			return nil, errgrpc.ToGRPC(fmt.Errorf("%w: keep the configuration: %v", errdefs.ErrInternal, err))
		}
	}
	c.apply(lc)
	// Debug, not Info: the claim waits for this answer, and a line the
	// agent writes goes through the engine's log pipeline (Docker's
	// json-file: the shim and dockerd wake for it), which made ten
	// parallel claims about 7 ms slower at the median on a 2-core host.
	// The orchestrator records the claim (the lease's transition).
	c.log.Debug("configured for a lease", "env", len(lc.Env), "secrets", len(lc.Secrets))
	return &agentv1.ConfigureResponse{}, nil
}

// openBlank makes the directory of path (mode 0700) and an empty file at
// path (mode 0600), and returns the file open for writing; nil when it
// cannot.
func openBlank(path string) *os.File {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil
	}
	return f
}

// writeState keeps lc in the state file: in place, with one write at
// offset 0 into the empty file held open since the start, when it fits
// in statefile.InPlaceMax; else (or without that file) through a temporary file
// renamed over it, so that a reader never sees part of it.
func (c *configurer) writeState(lc leaseConfig) error {
	b, err := statefile.Encode(lc)
	if err != nil {
		return err
	}
	if f := c.blank; f != nil {
		c.blank = nil
		defer f.Close()
		if len(b) <= statefile.InPlaceMax {
			n, err := f.WriteAt(b, 0)
			if err == nil && n == len(b) {
				return nil
			}
			// Nothing or part of it written: the whole write below
			// replaces the file.
		}
	}
	return writeState(c.stateFile, b)
}

// writeState writes b to path (mode 0600, its directory 0700), atomically.
func writeState(path string, b []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".configure-*")
	if err != nil {
		return err
	}
	// The path for a configuration bigger than one page, or when the
	// file held open from the start could not be made (writeState).
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
