package process

import (
	"testing"
	"time"

	"github.com/berth-dev/berth/pkg/agent/mask"
)

// TestMaskedOutput: with a Masker, secret values are replaced in Exec
// results, Stream chunks and background logs — also when the program writes
// a value in pieces (split across reads) — and a transformed value is not.
func TestMaskedOutput(t *testing.T) {
	t.Parallel()
	const val = "tok-S3cr3t-value"
	r := newRunner(t, Config{Masker: mask.New(map[string]string{"TOKEN": val})})
	ctx := ctxTimeout(t, 30*time.Second)
	env := map[string]string{"TOKEN": val}
	// The second value is written in two pieces with a pause between.
	cmd := `echo "a $TOKEN b"; echo "$TOKEN" >&2; printf 'tok-S3c'; sleep 0.2; printf 'r3t-value\n'; echo "$TOKEN" | tr a-z A-Z`
	const wantOut = "a <secret:TOKEN> b\n<secret:TOKEN>\nTOK-S3CR3T-VALUE\n"
	const wantErr = "<secret:TOKEN>\n"

	res, err := r.Exec(ctx, Spec{Command: cmd, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != wantOut || string(res.Stderr) != wantErr {
		t.Errorf("exec stdout %q stderr %q", res.Stdout, res.Stderr)
	}

	c := newCollector()
	if _, err := r.Stream(ctx, Spec{Command: cmd, Env: env}, c.emit); err != nil {
		t.Fatal(err)
	}
	if out, errOut := c.output(EventStdout), c.output(EventStderr); out != wantOut || errOut != wantErr {
		t.Errorf("stream stdout %q stderr %q", out, errOut)
	}

	in, err := r.Start(ctx, Spec{Command: cmd, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	waitExited(t, r, in.ID)
	c = newCollector()
	if err := r.Logs(ctx, in.ID, false, c.emit); err != nil {
		t.Fatal(err)
	}
	if out, errOut := c.output(EventStdout), c.output(EventStderr); out != wantOut || errOut != wantErr {
		t.Errorf("logs stdout %q stderr %q", out, errOut)
	}
}
