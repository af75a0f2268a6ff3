package kubernetes

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/berth-dev/berth/pkg/runtime"
)

// A Spec's app reaches the pod: the agent's --app flags in the command, and
// its key in the sandbox's Secret, referenced by the environment (not in
// the Pod object).
func TestPodApp(t *testing.T) {
	r := &Runtime{cfg: Config{Namespace: "ns"}, log: slog.Default()}
	spec := runtime.Spec{LeaseID: "l1", Image: "berth/base", AgentToken: "t",
		App: &runtime.App{Command: []string{"/usr/local/bin/openhands-agent-server"}, Port: 8000, Key: "the-key"}}
	secret, pod := r.buildObjects(spec, spec.Resources)
	cmd := pod.Spec.Containers[0].Command
	if i := slices.Index(cmd, "--app"); i < 0 || cmd[i+1] != `["/usr/local/bin/openhands-agent-server"]` || !slices.Contains(cmd, "--app-port") {
		t.Fatalf("command %q", cmd)
	}
	if string(secret.Data[appKeyKey]) != "the-key" {
		t.Fatalf("secret data %v", secret.Data)
	}
	for _, e := range pod.Spec.Containers[0].Env {
		if e.Name == runtime.AgentAppKeyEnv {
			if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef.Key != appKeyKey {
				t.Fatalf("key env %+v", e)
			}
			return
		}
	}
	t.Fatalf("no %s in %+v", runtime.AgentAppKeyEnv, pod.Spec.Containers[0].Env)
}
