package process

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakeOOM returns a counter file in the format of memory.oom_control and a
// Config whose OOMKills reads it; a command "bumps" the count by writing
// `oom_kill 1` into $OOMF, as the kernel does before it kills.
func fakeOOM(t *testing.T) (Config, map[string]string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "memory.oom_control")
	if err := os.WriteFile(f, []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Config{OOMKills: func() (uint64, bool) { return readOOMKill(f) }}, map[string]string{"OOMF": f}
}

const bump = `printf 'oom_kill 1\n' > "$OOMF"; `

// TestOOMHeuristic: a command is reported OOM-killed only when it died of a
// SIGKILL the agent did not send (or a shell reported one with 137) while
// the cgroup's oom_kill count rose.
func TestOOMHeuristic(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name    string
		spec    Spec
		code    int
		signal  string
		oom     bool
		timeout bool
	}{
		{"killed while the count rose", Spec{Command: bump + "kill -KILL $$"}, -1, "SIGKILL", true, false},
		{"shell reports a SIGKILLed child", Spec{Command: bump + "exit 137"}, 137, "", true, false},
		{"killed, count unchanged", Spec{Command: "kill -KILL $$"}, -1, "SIGKILL", false, false},
		{"count rose, other exit", Spec{Command: bump + "exit 3"}, 3, "", false, false},
		{"count rose, SIGTERM", Spec{Command: bump + "kill -TERM $$"}, -1, "SIGTERM", false, false},
		{"agent's own SIGKILL after a timeout", Spec{Command: bump + "trap '' TERM; sleep 5", Timeout: 200 * time.Millisecond, KillGrace: 100 * time.Millisecond}, -1, "SIGKILL", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, env := fakeOOM(t)
			r := newRunner(t, cfg)
			tc.spec.Env = env
			res, err := r.Exec(ctx, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || res.Signal != tc.signal || res.OOMKilled != tc.oom || res.TimedOut != tc.timeout {
				t.Errorf("exit %d signal %q oom %v timedOut %v, want %d %q %v %v (stderr %q)",
					res.ExitCode, res.Signal, res.OOMKilled, res.TimedOut, tc.code, tc.signal, tc.oom, tc.timeout, res.Stderr)
			}
		})
	}
}

// TestOOMStreamAndBackground: the stream's exit event and a background
// process's state carry the verdict; a SIGKILL requested through Signal is
// not an OOM kill.
func TestOOMStreamAndBackground(t *testing.T) {
	t.Parallel()
	ctx := ctxTimeout(t, 30*time.Second)
	cfg, env := fakeOOM(t)
	r := newRunner(t, cfg)

	c := newCollector()
	res, err := r.Stream(ctx, Spec{Command: bump + "kill -KILL $$", Env: env}, c.emit)
	if err != nil {
		t.Fatal(err)
	}
	evs := c.snapshot()
	if last := evs[len(evs)-1]; last.Kind != EventExited || !last.Exit.OOMKilled || !res.OOMKilled {
		t.Errorf("stream: exit event %+v, result %+v: want oom killed", last.Exit, res.ExitStatus)
	}
	if ex := exitedToProto(evs[len(evs)-1].Exit); !ex.GetOomKilled() || ex.GetSignal() != "SIGKILL" {
		t.Errorf("proto exit event %v", ex)
	}

	cfg2, env2 := fakeOOM(t)
	r2 := newRunner(t, cfg2)
	bg, err := r2.Start(ctx, Spec{Command: bump + "kill -KILL $$", Env: env2})
	if err != nil {
		t.Fatal(err)
	}
	in := waitExited(t, r2, bg.ID)
	if in.Exit == nil || !in.Exit.OOMKilled || !infoToProto(in).GetOomKilled() {
		t.Errorf("background: %+v, want oom killed", in.Exit)
	}

	cfg3, env3 := fakeOOM(t)
	r3 := newRunner(t, cfg3)
	sig, err := r3.Start(ctx, Spec{Command: bump + "sleep 100", Env: env3})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let it bump the count
	if err := r3.Signal(sig.ID, "KILL"); err != nil {
		t.Fatal(err)
	}
	if in := waitExited(t, r3, sig.ID); in.Exit == nil || in.Exit.Signal != "SIGKILL" || in.Exit.OOMKilled {
		t.Errorf("signalled with KILL: %+v, want SIGKILL and not oom killed", in.Exit)
	}
}

// TestOOMFile: the agent's own cgroup file is found from /proc/self/cgroup,
// falling back to the root's file inside a container.
func TestOOMFile(t *testing.T) {
	t.Parallel()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v1 := t.TempDir()
	write(filepath.Join(v1, "memory", "memory.oom_control"), "oom_kill_disable 0\noom_kill 7\n")
	write(filepath.Join(v1, "memory", "a", "b", "memory.oom_control"), "oom_kill_disable 0\noom_kill 2\n")
	v2 := t.TempDir()
	write(filepath.Join(v2, "memory.events"), "low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n")
	write(filepath.Join(v2, "x", "memory.events"), "low 0\noom_kill 4\n")
	for _, tc := range []struct {
		name, root, self string
		want             uint64
		ok               bool
	}{
		{"v1 own cgroup", v1, "5:cpu:/a\n4:memory:/a/b\n0::/\n", 2, true},
		{"v1 in a container (path not mounted)", v1, "4:memory:/docker/abc\n", 7, true},
		{"v2 own cgroup", v2, "0::/x\n", 4, true},
		{"v2 namespaced", v2, "0::/\n", 1, true},
		{"v2 path missing", v2, "0::/nope\n", 1, true},
		{"nothing", t.TempDir(), "0::/\n", 0, false},
	} {
		p := oomFile(tc.root, []byte(tc.self))
		n, ok := readOOMKill(p)
		if ok != tc.ok || n != tc.want {
			t.Errorf("%s: file %q: %d %v, want %d %v", tc.name, p, n, ok, tc.want, tc.ok)
		}
	}
}
