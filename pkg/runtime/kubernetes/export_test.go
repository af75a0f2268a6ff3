package kubernetes

import "k8s.io/apimachinery/pkg/labels"

// SparesBound returns how many spares Create could take now, as the
// runtime's informer shows them (the tests wait for it to catch up with
// what they saw).
func (r *Runtime) SparesBound() int {
	s := r.spares
	if s == nil || !s.synced() {
		return 0
	}
	all, err := s.lister.PersistentVolumeClaims(r.cfg.Namespace).List(labels.Everything())
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range all {
		if takeable(c, s.value, s.spec()) {
			n++
		}
	}
	return n
}
