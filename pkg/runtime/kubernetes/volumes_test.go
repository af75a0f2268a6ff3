package kubernetes

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// workspaceSpec is a spec whose /workspace is owner's conversation's
// persistent volume vol.
func workspaceSpec(lease, vol, owner, conv string) runtime.Spec {
	labels := runtime.VolumeLabels(owner, conv)
	labels[runtime.LabelInstance] = "inst"
	return runtime.Spec{LeaseID: lease, ConversationID: conv, Image: "img:1", AgentToken: "tok",
		Mounts: []runtime.Mount{{Type: runtime.MountVolume, Source: vol, Target: workDir, VolumeLabels: labels}}}
}

// TestBuildObjectsVolume: a persistent workspace's claim is the Pod's
// /workspace instead of the sandbox's own claim; another volume is
// mounted at its target.
func TestBuildObjectsVolume(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns", AgentImage: "agent:1"}}
	spec := workspaceSpec("lease-1", "berth-ws-0123", "alice", "conv 1")
	spec.Mounts = append(spec.Mounts, runtime.Mount{Type: runtime.MountVolume, Source: "berth-ws-other", Target: "/data", ReadOnly: true})
	_, pod := r.buildObjects(spec, runtime.Resources{})
	if got := claimOfPod(pod); got != "berth-ws-0123" {
		t.Errorf("workspace claim = %q, want the volume's", got)
	}
	var found bool
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == "berth-ws-other" {
			found = v.PersistentVolumeClaim.ReadOnly
			for _, m := range pod.Spec.Containers[0].VolumeMounts {
				if m.Name == v.Name && (m.MountPath != "/data" || !m.ReadOnly) {
					t.Errorf("mount of %s = %+v", v.Name, m)
				}
			}
		}
	}
	if !found {
		t.Errorf("no read-only volume berth-ws-other in %+v", pod.Spec.Volumes)
	}
	_, plain := r.buildObjects(runtime.Spec{LeaseID: "lease-2", Image: "img:1", AgentToken: "tok"}, runtime.Resources{})
	if got := claimOfPod(plain); got != claimName(plain.Name) {
		t.Errorf("workspace claim without a volume = %q, want the sandbox's own", got)
	}
}

// TestVolumes: the volume claims' life on a fake cluster: created once
// with their labels and reused, listed, inspected, refused while a Pod
// mounts them, removed; a claim berth did not make as a workspace is
// neither mounted nor listed.
func TestVolumes(t *testing.T) {
	r, cs := startFake(t)
	ctx := context.Background()
	claims := cs.CoreV1().PersistentVolumeClaims("ns")
	spec := workspaceSpec("lease-1", "berth-ws-aaaa", "alice", "conversation with spaces")
	for range 2 {
		if err := r.ensureVolumeClaims(ctx, spec, runtime.Resources{DiskBytes: 2 << 30}, nil); err != nil {
			t.Fatal(err)
		}
	}
	c, err := claims.Get(ctx, "berth-ws-aaaa", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Labels[LabelSandbox] != "" || c.Labels[runtime.LabelVolume] != runtime.VolumeKindWorkspace || c.Labels[runtime.LabelOwner] != "alice" {
		t.Errorf("claim labels = %v", c.Labels)
	}
	if size := c.Spec.Resources.Requests[corev1.ResourceStorage]; size.Value() != 2<<30 {
		t.Errorf("claim size = %s, want the disk limit", size.String())
	}
	if n := countActions(cs, "create", "persistentvolumeclaims"); n != 1 {
		t.Errorf("%d claims created, want 1 (the second Create mounts it again)", n)
	}
	if err := r.ensureVolumeClaims(ctx, workspaceSpec("lease-2", "berth-ws-bbbb", "bob", "c2"), runtime.Resources{}, nil); err != nil {
		t.Fatal(err)
	}
	// A claim of that name that is not a berth workspace.
	if _, err := claims.Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "berth-ws-cccc", Namespace: "ns",
		Labels: map[string]string{runtime.LabelManaged: "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.ensureVolumeClaims(ctx, workspaceSpec("lease-3", "berth-ws-cccc", "carol", "c3"), runtime.Resources{}, nil); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("mounting a claim that is no workspace: %v, want FailedPrecondition", err)
	}

	all, err := r.ListVolumes(ctx, nil)
	if err != nil || len(all) != 2 {
		t.Fatalf("ListVolumes = %+v, %v; want the 2 workspaces", all, err)
	}
	mine, err := r.ListVolumes(ctx, runtime.Selector{runtime.LabelOwner: "alice", runtime.LabelConversation: "conversation with spaces"})
	if err != nil || len(mine) != 1 || mine[0].Name != "berth-ws-aaaa" || mine[0].ConversationID != "conversation with spaces" || mine[0].SizeBytes != -1 {
		t.Errorf("ListVolumes(alice's conversation) = %+v, %v", mine, err)
	}
	if v, err := r.InspectVolume(ctx, "berth-ws-aaaa"); err != nil || v.Owner != "alice" {
		t.Errorf("InspectVolume = %+v, %v", v, err)
	}
	for _, name := range []string{"berth-ws-cccc", "berth-ws-none"} {
		if _, err := r.InspectVolume(ctx, name); !errdefs.IsNotFound(err) {
			t.Errorf("InspectVolume(%s) = %v, want NotFound", name, err)
		}
	}

	// In use by a Pod: refused; then removed.
	_, pod := r.buildObjects(spec, runtime.Resources{})
	pod.UID = "uid-user"
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for r.pods.cached("ns", pod.Name) == nil {
		if err := ctx.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.RemoveVolume(ctx, "berth-ws-aaaa"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("RemoveVolume of a mounted volume: %v, want FailedPrecondition", err)
	}
	if err := r.RemoveVolume(ctx, "berth-ws-bbbb"); err != nil {
		t.Fatal(err)
	}
	if _, err := claims.Get(ctx, "berth-ws-bbbb", metav1.GetOptions{}); err == nil {
		t.Error("RemoveVolume left the claim")
	}
	if err := r.RemoveVolume(ctx, "berth-ws-bbbb"); err != nil {
		t.Errorf("RemoveVolume of a missing volume: %v, want success", err)
	}
	if err := r.RemoveVolume(ctx, "berth-ws-cccc"); !errdefs.IsNotFound(err) {
		t.Errorf("RemoveVolume of a claim that is no workspace: %v, want NotFound", err)
	}
}
