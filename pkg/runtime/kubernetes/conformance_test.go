package kubernetes_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/conformance"
	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// The cluster tests run with BERTH_K8S=1, against the cluster of
// `make k8s-up` (or the one $BERTH_K8S_DIR describes: admin.kubeconfig,
// berth.kubeconfig): the runtime under test uses the orchestrator's
// ServiceAccount (deploy/kubernetes), the hooks (kill, unmanaged Pods) the
// admin's kubeconfig and the node's containerd socket. `make test` sets
// BERTH_K8S=1 and brings the cluster up when it is not running
// (scripts/k8s/test.sh; docs/kubernetes.md). Without BERTH_K8S they skip,
// or fail under BERTH_REQUIRE_DOCKER=1 (CI); BERTH_K8S=0 and -short are a
// run's own choice: a plain skip.
const (
	nodeName = "localhost"
	nodeSock = "/run/berth-k8s/containerd.sock"
)

// needCluster skips unless BERTH_K8S=1 (see above), and returns the admin
// client and the cluster's directory.
func needCluster(t *testing.T) (*kubernetes.Clientset, string) {
	t.Helper()
	dir := testenv.K8sDir(t)
	rc, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		t.Fatalf("admin kubeconfig (make k8s-up; %s=1 needs the test cluster): %v", testenv.K8sEnv, err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dir
}

// loadImage copies a Docker image into the node's containerd.
func loadImage(t *testing.T, ref string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `docker save "$1" | ctr --address "$2" --namespace k8s.io images import -`, "sh", ref, nodeSock)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("load %s into the node: %v\n%s", ref, err, out)
	}
}

// emptyImage makes ref in Docker (an empty root filesystem with user) and
// loads it into the node.
func emptyImage(t *testing.T, ref, user string) {
	t.Helper()
	var buf bytes.Buffer
	_ = tar.NewWriter(&buf).Close()
	args := []string{"import"}
	if user != "" {
		args = append(args, "-c", "USER "+user)
	}
	cmd := exec.Command("docker", append(args, "-", ref)...)
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker import %s: %v\n%s", ref, err, out)
	}
	loadImage(t, ref)
}

func newRuntime(t *testing.T, dir string) *k8s.Runtime {
	t.Helper()
	rt, err := k8s.New(context.Background(), k8s.Config{
		Kubeconfig:           filepath.Join(dir, "berth.kubeconfig"),
		NodeName:             nodeName,
		AgentImagePullPolicy: corev1.PullNever,
		ImagePullPolicy:      corev1.PullNever,
		NetworkPolicy:        true,
		Logger:               slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

func TestConformance(t *testing.T) {
	admin, dir := needCluster(t)
	if out, err := exec.Command("../../../scripts/k8s/agent-image.sh").CombinedOutput(); err != nil {
		t.Fatalf("agent image: %v\n%s", err, out)
	}
	for _, img := range conformance.TestImages() {
		emptyImage(t, img.Ref, img.User)
	}
	loadImage(t, "berth/minimal:latest")
	var rt *k8s.Runtime
	kill := func(ctx context.Context, id string) error { return killSandbox(ctx, admin, rt.Namespace(), id) }
	unmanaged := func(t *testing.T, image string) (string, func() bool) {
		no := false
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "not-berth-", Namespace: rt.Namespace()},
			Spec: corev1.PodSpec{NodeName: nodeName, AutomountServiceAccountToken: &no, RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "c", Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"/none"}}}},
		}
		created, err := admin.CoreV1().Pods(rt.Namespace()).Create(context.Background(), pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			zero := int64(0)
			_ = admin.CoreV1().Pods(rt.Namespace()).Delete(context.Background(), created.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		return created.Name, func() bool {
			_, err := admin.CoreV1().Pods(rt.Namespace()).Get(context.Background(), created.Name, metav1.GetOptions{})
			return err == nil
		}
	}
	conformance.Run(t, func(t *testing.T) runtime.Runtime { rt = newRuntime(t, dir); return rt },
		conformance.Images{Empty: conformance.EmptyImage, Shell: "berth/minimal:latest", BadUser: conformance.BadUserImage},
		conformance.WithKill(kill), conformance.WithUnmanaged(unmanaged), conformance.WithReadyTimeout(60*time.Second))
}

// killSandbox kills sandbox id's container through the node's containerd.
// Create returns once the agent answers, which may be before the kubelet
// has reported the container (its next sync of the Pod, up to a second
// later): it waits for its id.
func killSandbox(ctx context.Context, admin kubernetes.Interface, ns, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		pod, err := admin.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, st := range pod.Status.ContainerStatuses {
			if st.Name == "sandbox" && st.ContainerID != "" {
				cid := strings.TrimPrefix(st.ContainerID, "containerd://")
				out, err := exec.CommandContext(ctx, "ctr", "--address", nodeSock, "--namespace", "k8s.io",
					"tasks", "kill", "--signal", "SIGKILL", cid).CombinedOutput()
				if err != nil {
					return fmt.Errorf("ctr tasks kill %s: %v: %s", cid, err, out)
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s has no sandbox container id: %w", id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
