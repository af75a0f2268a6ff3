package kubestore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/lease"
)

// The BerthLease resource (deploy/kubernetes/crd-berthleases.yaml).
const (
	// Group is the API group of BerthLease.
	Group = "berth.dev"
	// Version is the API version of BerthLease.
	Version = "v1alpha1"
	// Kind is the kind of a lease record.
	Kind = "BerthLease"
	// Resource is the plural resource name of BerthLease.
	Resource = "berthleases"
	// CRDName is the name of the CustomResourceDefinition.
	CRDName = Resource + "." + Group
)

// GVR is the group, version and resource of BerthLease.
var GVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: Resource}

// Labels and annotations of the objects the store writes.
const (
	// LabelManagedBy is set to ManagedBy on every object the store writes.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedBy is the value of LabelManagedBy.
	ManagedBy = "berth"
	// LabelState is a BerthLease's state (lease.State, "READY").
	LabelState = "berth.dev/state"
	// LabelInstance is a BerthLease's home replica (lease.Lease.Instance),
	// set only when it is a valid label value.
	LabelInstance = "berth.dev/instance"
	// LabelFleet is the fleet of a BerthLease or a conversation lock
	// (Config.Fleet; DefaultFleet when unset): a Store reads only its
	// fleet's records.
	LabelFleet = "berth.dev/fleet"
	// DefaultFleet is the fleet of a Store whose Config.Fleet is "".
	DefaultFleet = "default"
	// AnnotationWriter is the instance id of the replica that wrote a
	// BerthLease last; Subscribe leaves out the records of its own Store.
	AnnotationWriter = "berth.dev/writer"
	// LabelKind marks a conversation lock (value KindConversationLock).
	LabelKind = "berth.dev/kind"
	// KindConversationLock is LabelKind's value on a conversation lock.
	KindConversationLock = "conversation-lock"
	// LockPrefix starts the name of every conversation lock.
	LockPrefix = "berth-conv-"
)

// LockName returns the name of the coordination.k8s.io Lease that locks
// (owner, conversation) in the default fleet: LockPrefix and the first 40
// hex digits of sha256(owner "\x00" conversation). It is a valid DNS
// label (51 characters) whatever the owner and conversation are.
func LockName(owner, conversation string) string {
	return FleetLockName(DefaultFleet, owner, conversation)
}

// FleetLockName is LockName in fleet: LockName's for DefaultFleet (or
// ""), else LockPrefix and the first 40 hex digits of sha256(fleet "\x00"
// owner "\x00" conversation), so that two fleets of a namespace lock the
// same conversation apart.
func FleetLockName(fleet, owner, conversation string) string {
	key := owner + "\x00" + conversation
	if fleet != "" && fleet != DefaultFleet {
		key = fleet + "\x00" + key
	}
	sum := sha256.Sum256([]byte(key))
	return LockPrefix + hex.EncodeToString(sum[:])[:40]
}

// checkName reports an error wrapping errdefs.ErrInvalidArgument when id
// cannot be a BerthLease's name (a DNS subdomain; lease ids always are).
func checkName(id string) error {
	if id == "" {
		return errdefs.InvalidArgument("id", "lease id is empty")
	}
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
		return errdefs.InvalidArgument("id", "lease id %q cannot name a %s: %s", id, Kind, errs[0])
	}
	return nil
}

// labelsOf returns the labels of l's BerthLease in fleet: LabelManagedBy
// and LabelFleet always, LabelState and LabelInstance when their values
// are valid label values.
func labelsOf(l lease.Lease, fleet string) map[string]string {
	ls := map[string]string{LabelManagedBy: ManagedBy, LabelFleet: fleet}
	if validLabelValue(string(l.State)) {
		ls[LabelState] = string(l.State)
	}
	if validLabelValue(l.Instance) {
		ls[LabelInstance] = l.Instance
	}
	return ls
}

// validLabelValue reports whether v is a non-empty valid label value (63
// characters of [A-Za-z0-9_.-], alphanumeric at both ends).
func validLabelValue(v string) bool {
	return v != "" && len(validation.IsValidLabelValue(v)) == 0
}

// encode returns l as a BerthLease of namespace ns and fleet written by
// writer.
func encode(l lease.Lease, ns, fleet, writer string) (*unstructured.Unstructured, error) {
	if err := checkName(l.ID); err != nil {
		return nil, err
	}
	b, err := json.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("%w: kubestore: encode lease %s: %v", errdefs.ErrInternal, l.ID, err)
	}
	var record map[string]any
	// apimachinery's json keeps integers int64 (encoding/json would make
	// them float64, which unstructured objects refuse and which loses
	// digits past 2^53).
	if err := utiljson.Unmarshal(b, &record); err != nil {
		return nil, fmt.Errorf("%w: kubestore: encode lease %s: %v", errdefs.ErrInternal, l.ID, err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       Kind,
		"spec":       map[string]any{"record": record},
	}}
	u.SetName(l.ID)
	u.SetNamespace(ns)
	u.SetLabels(labelsOf(l, fleet))
	if writer != "" {
		u.SetAnnotations(map[string]string{AnnotationWriter: writer})
	}
	return u, nil
}

// decode returns the lease record of a BerthLease. An object without
// spec.record, or whose record does not decode or names another lease,
// is an error wrapping errdefs.ErrInternal.
func decode(u *unstructured.Unstructured) (lease.Lease, error) {
	name := u.GetName()
	record, found, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "record")
	if err != nil || !found {
		return lease.Lease{}, fmt.Errorf("%w: kubestore: %s %s/%s has no spec.record", errdefs.ErrInternal, Kind, u.GetNamespace(), name)
	}
	if _, ok := record.(map[string]any); !ok {
		return lease.Lease{}, fmt.Errorf("%w: kubestore: %s %s/%s: spec.record is a %T, not an object", errdefs.ErrInternal, Kind, u.GetNamespace(), name, record)
	}
	b, err := json.Marshal(record)
	if err != nil {
		return lease.Lease{}, fmt.Errorf("%w: kubestore: %s %s/%s: spec.record: %v", errdefs.ErrInternal, Kind, u.GetNamespace(), name, err)
	}
	var l lease.Lease
	if err := json.Unmarshal(b, &l); err != nil {
		return lease.Lease{}, fmt.Errorf("%w: kubestore: %s %s/%s: decode spec.record: %v", errdefs.ErrInternal, Kind, u.GetNamespace(), name, err)
	}
	switch l.ID {
	case "":
		l.ID = name
	case name:
	default:
		return lease.Lease{}, fmt.Errorf("%w: kubestore: %s %s/%s holds the record of lease %q", errdefs.ErrInternal, Kind, u.GetNamespace(), name, l.ID)
	}
	return l, nil
}

// writerOf returns the AnnotationWriter of a BerthLease.
func writerOf(u *unstructured.Unstructured) string {
	return u.GetAnnotations()[AnnotationWriter]
}
