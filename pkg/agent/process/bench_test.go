package process

import (
	"context"
	"os/exec"
	"testing"
)

// BenchmarkExecTrue measures Runner.Exec of /bin/true.
func BenchmarkExecTrue(b *testing.B) {
	r := newRunner(b, Config{})
	ctx := context.Background()
	spec := Spec{Argv: []string{"/bin/true"}}
	for b.Loop() {
		res, err := r.Exec(ctx, spec)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkForkExecTrue measures a bare fork/exec of /bin/true, the
// baseline for BenchmarkExecTrue.
func BenchmarkForkExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
