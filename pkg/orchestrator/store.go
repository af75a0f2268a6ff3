package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"

	"github.com/berth-dev/berth/pkg/lease"
	"github.com/berth-dev/berth/pkg/lease/kubestore"
)

// leaseStore is a lease.Store the Server closes.
type leaseStore interface {
	lease.Store
	Close() error
}

// openStore opens the lease store cfg.LeaseStore names: the cluster
// namespace's BerthLease objects (kubestore: shared by every replica, which
// makes the lease manager run in fleet mode, pkg/lease/replicas.go) by
// default on a cluster, else the bbolt file in the data dir.
func openStore(ctx context.Context, cfg Config, c Cluster, instance string, log *slog.Logger) (leaseStore, error) {
	if cfg.LeaseStore == "local" || (cfg.LeaseStore == "" && c == nil) {
		return lease.OpenBolt(filepath.Join(cfg.DataDir, lease.DBFileName))
	}
	if c == nil {
		return nil, fmt.Errorf("lease store %q needs the kubernetes runtime", cfg.LeaseStore)
	}
	return kubestore.New(ctx, kubestore.Config{REST: c.RESTConfig(), Namespace: c.Namespace(), Instance: instance, Fleet: cfg.Fleet,
		Logger: log.With("component", "kubestore")})
}

// instanceIDPattern is a DNS label: an instance id is a label value, a
// Kubernetes identity and part of names.
var instanceIDPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func validInstanceID(id string) bool { return instanceIDPattern.MatchString(id) }

// instanceID is cfg.InstanceID, else the one kept in the data directory.
func instanceID(cfg Config) (string, error) {
	if cfg.InstanceID != "" {
		return cfg.InstanceID, nil
	}
	return loadOrCreateInstanceID(filepath.Join(cfg.DataDir, instanceFile))
}
