package kubernetes_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/berth-dev/berth/internal/testsupport/k8sclaim"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	k8s "github.com/berth-dev/berth/pkg/runtime/kubernetes"
)

// TestAgentClaim: with Config.AgentClaim, a sandbox's Pod has no init
// container and runs the agent from the claim, mounted read-only; Ping
// refuses a claim that is not there, naming it.
func TestAgentClaim(t *testing.T) {
	cs, dir := needCluster(t)
	loadImage(t, "berth/minimal:latest")
	newRT := func(claim string) *k8s.Runtime {
		rt, err := k8s.New(context.Background(), k8s.Config{
			Kubeconfig: filepath.Join(dir, "berth.kubeconfig"), NodeName: nodeName, AgentClaim: claim,
			AgentImagePullPolicy: corev1.PullNever, ImagePullPolicy: corev1.PullNever,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rt.Close() })
		return rt
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	missing := newRT("berth-agent-missing")
	if err := missing.Ping(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "berth-agent-missing") {
		t.Fatalf("Ping with a missing agent claim: %v, want FailedPrecondition naming it", err)
	}

	probe := newRT("")
	claim := k8sclaim.Agent(t, cs, probe.Namespace())
	rt := newRT(claim)
	if err := rt.Ping(ctx); err != nil {
		t.Fatalf("Ping with agent claim %s: %v", claim, err)
	}
	sb, err := rt.Create(ctx, runtime.Spec{Image: "berth/minimal:latest", LeaseID: fmt.Sprintf("agentclaim-%d", time.Now().UnixNano()%1e6),
		AgentToken: "tok-agentclaim", InstanceID: "agentclaim-test", ReadyTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatalf("Create with the agent from claim %s: %v", claim, err)
	}
	t.Cleanup(func() {
		if err := rt.Remove(context.Background(), sb.ID); err != nil {
			t.Errorf("cleanup: remove %s: %v", sb.ID, err)
		}
	})
	pod, err := cs.CoreV1().Pods(rt.Namespace()).Get(ctx, sb.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 0 {
		t.Errorf("pod %s has init containers %v, want none with an agent claim", pod.Name, pod.Spec.InitContainers)
	}
	found := false
	for _, v := range pod.Spec.Volumes {
		if c := v.PersistentVolumeClaim; c != nil && c.ClaimName == claim {
			found = c.ReadOnly
		}
	}
	if !found {
		t.Errorf("pod %s does not mount claim %s read-only: %+v", pod.Name, claim, pod.Spec.Volumes)
	}
	// Create answered once the agent answered its probe: it runs from the
	// claim. Its token works and the agent dir is read-only to it.
	out, code := execIn(t, sb, "tok-agentclaim", "touch "+runtime.AgentPath+" 2>&1 || echo refused")
	if code != 0 || !strings.Contains(out, "refused") {
		t.Errorf("writing the agent from the sandbox: exit %d, %q; want refused", code, out)
	}
}

// execIn runs a shell line in sb through its agent's REST exec and
// returns its stdout and exit code.
func execIn(t *testing.T, sb runtime.Sandbox, token, line string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"command": line, "timeout": "30s"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+sb.Endpoint+"/v1/exec", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil {
		t.Fatalf("exec %q: %v", line, err)
	}
	defer resp.Body.Close()
	var res struct {
		ExitCode int    `json:"exitCode"`
		Stdout   string `json:"stdout"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("exec %q: HTTP %d, %v", line, resp.StatusCode, err)
	}
	return res.Stdout, res.ExitCode
}
