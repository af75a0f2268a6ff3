package runtime_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestAgentPaths pins where the agent lives in every sandbox: images,
// tests and operators rely on these paths.
func TestAgentPaths(t *testing.T) {
	if runtime.AgentPath != "/.berth/sandbox-agent" || runtime.TokenPath != "/.berth/token" ||
		runtime.DefaultWorkDir != "/workspace" || runtime.HealthPath != "/healthz" ||
		runtime.AgentTokenEnv != "BERTH_AGENT_TOKEN" || runtime.AgentPort != 7000 {
		t.Errorf("agent paths changed: %s %s %s %s %s %d", runtime.AgentPath, runtime.TokenPath,
			runtime.DefaultWorkDir, runtime.HealthPath, runtime.AgentTokenEnv, runtime.AgentPort)
	}
	if !strings.HasPrefix(runtime.AgentTokenEnv, runtime.AgentEnvPrefix) {
		t.Errorf("%s is not under the reserved prefix %s", runtime.AgentTokenEnv, runtime.AgentEnvPrefix)
	}
	// A Spec cannot set the agent's variables.
	spec := runtime.Spec{LeaseID: "l", Image: "berth/base", AgentToken: "t", Env: map[string]string{runtime.AgentTokenEnv: "x"}}
	if err := spec.Validate(); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a Spec setting %s: %v", runtime.AgentTokenEnv, err)
	}
}

// TestAgentCommandArgs checks the agent's command line and the order of
// its flags.
func TestAgentCommandArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   runtime.AgentCommand
		want []string
	}{
		{"token file", runtime.AgentCommand{WorkDir: "/workspace"},
			[]string{"/.berth/sandbox-agent", "--listen", "0.0.0.0:7000", "--envd-listen", "0.0.0.0:49983", "--workdir", "/workspace", "--token-file", "/.berth/token"}},
		{"token in env", runtime.AgentCommand{WorkDir: "/src", TokenInEnv: true},
			[]string{"/.berth/sandbox-agent", "--listen", "0.0.0.0:7000", "--envd-listen", "0.0.0.0:49983", "--workdir", "/src"}},
		{"user and no root", runtime.AgentCommand{WorkDir: "/w", User: "1000:1000", DenyRootUser: true},
			[]string{"/.berth/sandbox-agent", "--listen", "0.0.0.0:7000", "--envd-listen", "0.0.0.0:49983", "--workdir", "/w", "--user", "1000:1000", "--allow-root=false", "--token-file", "/.berth/token"}},
		{"chosen work dir", runtime.AgentCommand{WorkDir: "/etc", KeepWorkDirOwner: true, TokenInEnv: true},
			[]string{"/.berth/sandbox-agent", "--listen", "0.0.0.0:7000", "--envd-listen", "0.0.0.0:49983", "--workdir", "/etc", "--own-workdir=false"}},
		{"app", runtime.AgentCommand{WorkDir: "/w", TokenInEnv: true, App: &runtime.App{Command: []string{"/usr/local/bin/server", "--a b"}, Port: 8000, WorkDir: "/srv", Key: "k"}},
			[]string{"/.berth/sandbox-agent", "--listen", "0.0.0.0:7000", "--envd-listen", "0.0.0.0:49983", "--workdir", "/w", "--app", `["/usr/local/bin/server","--a b"]`, "--app-port", "8000", "--app-dir", "/srv"}},
	} {
		if got := tc.in.Args(); !slices.Equal(got, tc.want) {
			t.Errorf("%s: Args() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// elfFile writes a minimal little-endian ELF64 executable header, with one
// PT_INTERP program header when dynamic (what a dynamically linked binary
// has), and returns its path.
func elfFile(t *testing.T, dynamic bool) string {
	t.Helper()
	const ehsize, phsize = 64, 56
	b := make([]byte, ehsize+phsize)
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = 2, 1, 1 // 64-bit, little endian, version 1
	le := binary.LittleEndian
	le.PutUint16(b[16:], 2)    // ET_EXEC
	le.PutUint16(b[18:], 0x3e) // x86-64
	le.PutUint32(b[20:], 1)
	le.PutUint16(b[52:], ehsize)
	le.PutUint16(b[54:], phsize)
	le.PutUint16(b[58:], 64) // section header entry size
	if dynamic {
		le.PutUint64(b[32:], ehsize) // program headers right after the header
		le.PutUint16(b[56:], 1)
		le.PutUint32(b[ehsize:], 3) // PT_INTERP
	}
	p := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCheckAgentBinary: a static ELF file passes and reports its size;
// everything else is InvalidArgument naming agent_binary, with a hint.
func TestCheckAgentBinary(t *testing.T) {
	static := elfFile(t, false)
	if n, err := runtime.CheckAgentBinary(static); err != nil || n != 120 {
		t.Errorf("static ELF: size %d, %v", n, err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "script")
	_ = os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755)
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, nil, 0o755)
	for _, tc := range []struct{ name, path, want string }{
		{"unset", "", "is required"},
		{"missing", filepath.Join(dir, "missing"), "CGO_ENABLED=0 go build"},
		{"directory", dir, "not a regular non-empty file"},
		{"empty", empty, "not a regular non-empty file"},
		{"not ELF", script, "not an ELF"},
		{"dynamic", elfFile(t, true), "dynamically linked"},
	} {
		_, err := runtime.CheckAgentBinary(tc.path)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "agent_binary") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want InvalidArgument agent_binary %q", tc.name, err, tc.want)
		}
	}
}
