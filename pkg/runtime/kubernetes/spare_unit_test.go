package kubernetes

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/berth-dev/berth/pkg/runtime"
)

// spareOf returns a bound spare of fleet value with spec.
func spareOf(value string, spec corev1.PersistentVolumeClaimSpec) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "berth-spare-x", ResourceVersion: "42",
			Labels: map[string]string{runtime.LabelManaged: "true", runtime.LabelInstance: "maker", LabelSpareClaim: value}},
		Spec:   *spec.DeepCopy(),
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound},
	}
}

// TestSpareTakeable: a Create takes a bound spare of its fleet, size and
// class only.
func TestSpareTakeable(t *testing.T) {
	r := &Runtime{cfg: Config{StorageClass: "fast"}}
	want := r.claimSpec(runtime.Resources{})
	if !takeable(spareOf("fleet", want), "fleet", want) {
		t.Fatal("a bound spare of the fleet, size and class is not takeable")
	}
	other := r.claimSpec(runtime.Resources{DiskBytes: 2 << 30})
	pending := spareOf("fleet", want)
	pending.Status.Phase = corev1.ClaimPending
	deleting := spareOf("fleet", want)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	slow := "slow"
	otherClass := spareOf("fleet", want)
	otherClass.Spec.StorageClassName = &slow
	rwx := spareOf("fleet", want)
	rwx.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	for name, c := range map[string]*corev1.PersistentVolumeClaim{
		"another size": spareOf("fleet", other), "pending": pending, "being deleted": deleting,
		"another class": otherClass, "another fleet's": spareOf("other", want), "not ReadWriteOnce": rwx,
	} {
		if takeable(c, "fleet", want) {
			t.Errorf("a spare of %s is takeable", name)
		}
	}
	// The default class: a spare holds the class's name once created.
	def := (&Runtime{}).claimSpec(runtime.Resources{})
	named := spareOf("fleet", def)
	named.Spec.StorageClassName = &slow
	if !takeable(named, "fleet", def) {
		t.Error("a spare of the default class (named by the API server) is not takeable without a configured class")
	}
}

// TestTakePatch: the patch carries the spare's resourceVersion (the
// compare-and-swap), replaces its labels by the Pod's and records the take.
func TestTakePatch(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns", InstanceID: "inst"}}
	_, pod := r.buildObjects(runtime.Spec{LeaseID: "l1", Image: "i", AgentToken: "t"}, runtime.DefaultResources())
	now := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	b, err := takePatch(spareOf("fleet", r.claimSpec(runtime.Resources{})), pod, now)
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Metadata struct {
			ResourceVersion string             `json:"resourceVersion"`
			Labels          map[string]*string `json:"labels"`
			Annotations     map[string]string  `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	m := p.Metadata
	if m.ResourceVersion != "42" {
		t.Errorf("resourceVersion %q, want the spare's 42", m.ResourceVersion)
	}
	if v, ok := m.Labels[LabelSpareClaim]; !ok || v != nil {
		t.Errorf("the spare label is not removed: %s", b)
	}
	for k, want := range pod.Labels {
		if v := m.Labels[k]; v == nil || *v != want {
			t.Errorf("label %s: %v, want the Pod's %q", k, v, want)
		}
	}
	if *m.Labels[runtime.LabelInstance] != "inst" || *m.Labels[LabelSandbox] != pod.Name {
		t.Errorf("labels %s", b)
	}
	if m.Annotations[labelsAnnotation] != pod.Annotations[labelsAnnotation] || m.Annotations[takenAnnotation] != "2026-12-06T09:00:00Z" {
		t.Errorf("annotations %v", m.Annotations)
	}
}

// TestUseClaim: a Pod on a taken spare mounts it and names it; Remove's
// ownClaim finds it; without one it is claimName.
func TestUseClaim(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns"}}
	_, pod := r.buildObjects(runtime.Spec{LeaseID: "l1", Image: "i", AgentToken: "t"}, runtime.DefaultResources())
	if ownClaim(pod) != claimName(pod.Name) || claimOfPod(pod) != claimName(pod.Name) {
		t.Fatalf("own claim %s, mounted %s; want %s", ownClaim(pod), claimOfPod(pod), claimName(pod.Name))
	}
	useClaim(pod, "berth-spare-abc")
	if ownClaim(pod) != "berth-spare-abc" || claimOfPod(pod) != "berth-spare-abc" {
		t.Errorf("own claim %s, mounted %s; want berth-spare-abc", ownClaim(pod), claimOfPod(pod))
	}
}

// TestClaimAge: a taken spare's age counts from its take, so that the
// orphan sweep does not take a spare made long ago for an orphan while its
// Create is between the take and the Pod.
func TestClaimAge(t *testing.T) {
	now := time.Now()
	c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}}
	if age := claimAge(c, now); age < time.Hour {
		t.Errorf("age %s, want an hour", age)
	}
	c.Annotations = map[string]string{takenAnnotation: now.Add(-time.Second).UTC().Format(time.RFC3339)}
	if age := claimAge(c, now); age > 2*time.Second {
		t.Errorf("taken a second ago: age %s", age)
	}
}

// TestSpareValue: the fleet's label value is the Lease name, or a hash of
// a name no label value can hold.
func TestSpareValue(t *testing.T) {
	if v := spareValue("berth-leader"); v != "berth-leader" {
		t.Errorf("spareValue = %q", v)
	}
	long := "berth-leader-" + strings.Repeat("x", 80)
	v := spareValue(long)
	if len(validation.IsValidLabelValue(v)) != 0 || v == spareValue(long+"y") {
		t.Errorf("spareValue(long) = %q", v)
	}
}
