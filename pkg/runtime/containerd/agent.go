package containerd

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// installAgent copies the agent binary src into dir/SUM/sandbox-agent (SUM:
// the first 16 hex digits of its SHA-256; mode 0555) unless that copy
// exists, and returns its path. Sandboxes get hard links to it, so a
// rebuilt agent never changes under running sandboxes. Copies of other
// versions that no sandbox links to any more are removed.
func installAgent(src, dir string, log *slog.Logger) (string, error) {
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("%w: containerd: install the agent into %s: %w", errdefs.ErrInternal, dir, err)
	}
	in, err := os.Open(src)
	if err != nil {
		return "", errdefs.InvalidArgument("agent_binary", "%v", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name())
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		tmp.Close()
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	dst := filepath.Join(dir, sum, runtime.AgentFile)
	if _, err := os.Stat(dst); err != nil {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fail(err)
		}
		if err := os.Chmod(tmp.Name(), 0o555); err != nil {
			return fail(err)
		}
		if err := os.Rename(tmp.Name(), dst); err != nil {
			return fail(err)
		}
		log.Info("installed the sandbox agent", "path", dst)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() == sum || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		old := filepath.Join(dir, e.Name(), runtime.AgentFile)
		var st syscall.Stat_t
		if err := syscall.Stat(old, &st); err == nil && st.Nlink > 1 {
			continue // still linked into a sandbox
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err == nil {
			log.Info("removed an unused agent version", "path", old)
		}
	}
	return dst, nil
}
