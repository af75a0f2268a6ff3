package validate

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

func TestCommand(t *testing.T) {
	for _, tc := range []struct {
		argv  []string
		shell string
		field string // "" means valid
	}{
		{[]string{"ls"}, "", ""},
		{nil, "echo hi", ""},
		{nil, "", "argv"},
		{[]string{"ls"}, "echo", "argv"},
		{nil, "   ", "command"},
		{[]string{""}, "", "argv[0]"},
		{[]string{"ls", "a\x00b"}, "", "argv[1]"},
		{nil, "echo \x00", "command"},
	} {
		err := Command(tc.argv, tc.shell)
		if tc.field == "" {
			if err != nil {
				t.Errorf("Command(%q, %q) = %v, want nil", tc.argv, tc.shell, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("Command(%q, %q) = %v, want invalid argument naming %s", tc.argv, tc.shell, err, tc.field)
		}
	}
}

func TestEnvAndPaths(t *testing.T) {
	if err := Env(map[string]string{"A": "1"}); err != nil {
		t.Error(err)
	}
	for _, env := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A": "x\x00"}} {
		if err := Env(env); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Env(%q) = %v, want invalid argument", env, err)
		}
	}
	if p, err := AbsPath("path", "/a/../b/"); err != nil || p != "/b" {
		t.Errorf("AbsPath = %q, %v", p, err)
	}
	for _, p := range []string{"", "rel", "/a\x00", "/" + strings.Repeat("a", MaxPathLen)} {
		if _, err := AbsPath("path", p); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "path:") {
			t.Errorf("AbsPath(%q) = %v, want invalid argument naming path", p, err)
		}
	}
	if p, err := OptionalAbsPath("cwd", "", "/def"); err != nil || p != "/def" {
		t.Errorf("OptionalAbsPath default = %q, %v", p, err)
	}
}

// FuzzRequest checks the validators never panic and that whatever they
// accept is safe to hand to the kernel: no NUL bytes, absolute clean paths.
func FuzzRequest(f *testing.F) {
	f.Add("/workspace/a.txt", "ls", "-la", "echo hi", "KEY", "value")
	f.Add("relative", "", "", "", "", "")
	f.Add("/a/../../b", "sh", "a\x00b", "", "A=B", "x")
	f.Fuzz(func(t *testing.T, path, arg0, arg1, shell, envK, envV string) {
		if p, err := AbsPath("path", path); err == nil {
			if !filepath.IsAbs(p) || filepath.Clean(p) != p || strings.IndexByte(p, 0) >= 0 {
				t.Fatalf("AbsPath(%q) accepted %q", path, p)
			}
		} else if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("AbsPath(%q) error %v is not invalid argument", path, err)
		}
		var argv []string
		if arg0 != "" || arg1 != "" {
			argv = []string{arg0, arg1}
		}
		if err := Command(argv, shell); err == nil {
			for _, a := range append(argv, shell) {
				if strings.IndexByte(a, 0) >= 0 {
					t.Fatalf("Command accepted a NUL byte: %q %q", argv, shell)
				}
			}
			if (len(argv) == 0) == (shell == "") {
				t.Fatalf("Command accepted argv %q with shell %q", argv, shell)
			}
		} else if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Command error %v is not invalid argument", err)
		}
		if err := Env(map[string]string{envK: envV}); err == nil {
			if envK == "" || strings.ContainsAny(envK, "=\x00") || strings.IndexByte(envV, 0) >= 0 {
				t.Fatalf("Env accepted %q=%q", envK, envV)
			}
		}
	})
}
