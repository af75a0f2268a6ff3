package kubernetes

import "github.com/berth-dev/berth/internal/kubeerr"

// category returns berth's error category for an error of the Kubernetes
// API (internal/kubeerr).
func category(err error) error { return kubeerr.Category(err) }

// apiErr wraps err, met while doing op to object id ("" for none), with
// its category and what was being done (internal/kubeerr: context errors
// pass through with the op named; a forbidden call names the Role the
// orchestrator needs).
func (r *Runtime) apiErr(err error, op, id string) error {
	return kubeerr.Wrapper{Component: "kubernetes", Namespace: r.cfg.Namespace, Host: r.host}.Wrap(err, op, id)
}
