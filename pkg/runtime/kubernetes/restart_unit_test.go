package kubernetes

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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

// goneOn makes the API server answer verb on Pods with NotFound while the
// informer still holds the Pod: it was deleted behind the Runtime's back
// and the watch has not said so yet (the informer lists and watches; it
// never gets or deletes).
func goneOn(cs *fake.Clientset, verb string) {
	cs.PrependReactor(verb, "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		name := a.(interface{ GetName() string }).GetName() // a get or a delete
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
	})
}

// A Restart of a sandbox removed a moment ago, whose exited Pod the
// informer still holds, answers NotFound and creates no Pod: a removed
// sandbox is not brought back.
func TestRestartOfRemovedSandboxIsNotFound(t *testing.T) {
	for _, verb := range []string{"get", "delete"} { // removed before Restart read it, or between its read and its delete
		t.Run(verb, func(t *testing.T) {
			r, cs := startFake(t, exitedPod("gone"))
			goneOn(cs, verb)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := r.Restart(ctx, "gone")
			if !errdefs.IsNotFound(err) {
				t.Fatalf("Restart of a removed sandbox: %v, want NotFound", err)
			}
			if hasAction(cs, "create", "pods") {
				t.Fatal("Restart created the Pod of a removed sandbox again")
			}
		})
	}
}
