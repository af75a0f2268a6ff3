package kubernetes

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// exitedPod is cachePod with its sandbox's container ended.
func exitedPod(name string) *corev1.Pod {
	p := cachePod(name, true)
	p.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}}
	return p
}

// goneOnDelete makes the API server answer a Pod's delete with NotFound
// while the informer still holds the Pod: the Pod was deleted behind the
// Runtime's back and the watch has not said so yet.
func goneOnDelete(cs *fake.Clientset) {
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, a.(k8stesting.DeleteAction).GetName())
	})
}

// A Restart that finds the exited Pod gone when it deletes it (the cache
// lagged a Remove) answers NotFound and creates no Pod: Remove deleted the
// sandbox's Secret first, and a removed sandbox is not brought back.
func TestRestartOfRemovedSandboxIsNotFound(t *testing.T) {
	r, cs := startFake(t, exitedPod("gone"))
	goneOnDelete(cs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.Restart(ctx, "gone")
	if !errdefs.IsNotFound(err) {
		t.Fatalf("Restart after the Pod and its Secret were removed: %v, want NotFound", err)
	}
	if hasAction(cs, "create", "pods") {
		t.Fatal("Restart created the Pod of a removed sandbox again")
	}
}

// A Restart cut short between its delete and its create (the Secret is
// still there) creates the Pod again when the next Restart finds it gone.
func TestRestartAfterInterruptedRestartCreatesPod(t *testing.T) {
	r, cs := startFake(t, exitedPod("half"))
	if _, err := cs.CoreV1().Secrets("ns").Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName("half"), Namespace: "ns"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	goneOnDelete(cs)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _ = r.Restart(ctx, "half") // the fake runs no kubelet: it cannot become ready
	if !hasAction(cs, "create", "pods") {
		t.Fatal("Restart did not create the Pod again though its Secret is there")
	}
}
