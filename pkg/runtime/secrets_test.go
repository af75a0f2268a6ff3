package runtime_test

import (
	"maps"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

func TestSpecSecrets(t *testing.T) {
	s := runtime.Spec{LeaseID: "l-1", Image: "berth/base", AgentToken: "t",
		Env: map[string]string{"A": "1"}, Secrets: map[string]string{"TOKEN": "tv", "KEY": "kv"}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "1", "TOKEN": "tv", "KEY": "kv", runtime.AgentSecretsEnv: "KEY,TOKEN"}
	if got := s.Environ(); !maps.Equal(got, want) {
		t.Fatalf("Environ = %v, want %v", got, want)
	}
	if got := (runtime.Spec{Env: map[string]string{"A": "1"}}).Environ(); !maps.Equal(got, map[string]string{"A": "1"}) {
		t.Fatalf("Environ without secrets = %v", got)
	}
	for name, secrets := range map[string]map[string]string{
		"also in env": {"A": "x"},
		"comma":       {"A,B": "x"},
		"reserved":    {runtime.AgentSecretsEnv: "x"},
		"nul":         {"S": "a\x00b"},
	} {
		bad := s
		bad.Secrets = secrets
		if err := bad.Validate(); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: Validate = %v, want InvalidArgument", name, err)
		}
	}
}
