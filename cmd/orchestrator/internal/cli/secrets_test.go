package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/berth-dev/berth/internal/testsupport/orchtest"
)

func TestAcquireSecrets(t *testing.T) {
	s := orchtest.Start(t, nil)
	const val, envVal = "sk-cli-secret-value-1", "sk-from-env-value-2"
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		env := operatorEnv(s, &out, &errb)
		base := env.Getenv
		env.Getenv = func(k string) string {
			if k == "GH_TOKEN" {
				return envVal
			}
			return base(k)
		}
		code := Run(context.Background(), append([]string{"lease", "acquire"}, args...), env)
		return code, out.String(), errb.String()
	}
	code, out, errs := run("--conversation", "c-sec", "--secret", "API_KEY="+val, "--secret-env", "GH_TOKEN", "-o", "json")
	if code != 0 {
		t.Fatalf("acquire: %d %q %q", code, out, errs)
	}
	if compact := strings.Join(strings.Fields(out), ""); !strings.Contains(compact, `"secretNames":["API_KEY","GH_TOKEN"]`) {
		t.Errorf("acquire does not name the secrets: %s", out)
	}
	if strings.Contains(out+errs, val) || strings.Contains(out+errs, envVal) {
		t.Fatalf("acquire shows a value: %q %q", out, errs)
	}
	for _, bad := range [][]string{{"--secret", val}, {"--secret", "=" + val}, {"--secret-env", "UNSET_VAR"}} {
		code, out, errs := run(append([]string{"--conversation", "c-bad"}, bad...)...)
		if code != 2 || strings.Contains(out+errs, val) {
			t.Errorf("%v: exit %d %q %q, want 2 without the value", bad, code, out, errs)
		}
	}
}
