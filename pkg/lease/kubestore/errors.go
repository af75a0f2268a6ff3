package kubestore

import "github.com/berth-dev/berth/internal/kubeerr"

// installHint is what New says when the CRD is missing.
const installHint = "CRD " + CRDName + " is not installed: kubectl apply -f deploy/kubernetes/"

// category returns berth's error category for an error of the Kubernetes
// API (internal/kubeerr).
func category(err error) error { return kubeerr.Category(err) }

// apiErr wraps err, met while doing op to object name ("" for none), with
// its category and what was being done (internal/kubeerr: context errors
// pass through with the op named; a forbidden call names the Role the
// orchestrator needs).
func (s *Store) apiErr(err error, op, name string) error {
	return kubeerr.Wrapper{Component: "kubestore", Namespace: s.cfg.Namespace, Host: s.host}.Wrap(err, op, name)
}
