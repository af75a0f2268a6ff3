package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// cpShell runs a shell script with the real binary as $ORCH, pointed at
// base with token ($BERTH_ADDR, $BERTH_TOKEN), and returns its combined
// output.
func cpShell(tb testing.TB, base, token, script string) (string, error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-ec", script)
	cmd.Env = append(hermeticEnv(), "BERTH_ADDR="+base, "BERTH_TOKEN="+token, "ORCH="+orchBin)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func mustCpShell(tb testing.TB, base, token, script string) string {
	tb.Helper()
	out, err := cpShell(tb, base, token, script)
	if err != nil {
		tb.Fatalf("%s: %v\n%s", script, err, out)
	}
	return sortLines(out)
}

// sortLines sorts the lines of a tree listing (sort(1) orders them
// differently in the host and in the image).
func sortLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// listTree is the shell line that describes the tree in the current
// directory: every path with its type, mode and mtime, and each file's
// checksum, sorted (GNU and busybox find/stat/md5sum both do this).
const listTree = `find . -mindepth 1 | LC_ALL=C sort | while read -r p; do stat -c '%n %F %a %Y' "$p"; done; ` +
	`find . -type f | LC_ALL=C sort | xargs md5sum; find . -type l | LC_ALL=C sort | while read -r p; do echo "$p -> $(readlink "$p")"; done`

// TestCpDirWithDockerSandbox copies a directory tree into and out of a real
// Docker sandbox with the real binary: as paths, and through - with the
// system tar; each copy keeps the same paths, types, modes, mtimes,
// contents and symlinks, and matches what docker cp gives for the same
// container.
func TestCpDirWithDockerSandbox(t *testing.T) {
	requireImage(t, baseImage)
	dir, _ := newDataDir(t)
	o := startOrch(t, dir)
	r := o.mustAcquire(t, "cp-dir-"+randHex(4), baseImage, "600s")
	id, tok, cid := r.GetLease().GetId(), r.GetToken(), r.GetLease().GetContainerId()

	tmp := t.TempDir()
	src := filepath.Join(tmp, "src")
	mustCpShell(t, o.base, tok, fmt.Sprintf(`
		mkdir -p %[1]s/bin %[1]s/empty/deeper %[1]s/data
		printf '#!/bin/sh\necho ran\n' > %[1]s/bin/run.sh && chmod 755 %[1]s/bin/run.sh
		echo secret > %[1]s/secret && chmod 600 %[1]s/secret
		for i in $(seq 1 200); do echo "file $i" > %[1]s/data/f$i.txt; done
		ln -s bin/run.sh %[1]s/run
		ln -s ../secret %[1]s/data/secret-link
		chmod 700 %[1]s/empty
		find %[1]s -mindepth 1 -exec touch -h -d '2021-05-06 07:08:09' {} +`, src))
	want := mustCpShell(t, o.base, tok, "cd "+src+" && "+listTree)

	inSandbox := func(dir string) string {
		t.Helper()
		return sortLines(mustDocker(t, "exec", cid, "sh", "-c", "cd "+dir+" && "+listTree))
	}
	// Up, as a path: a new DST gets SRC's contents.
	out := mustCpShell(t, o.base, tok, `"$ORCH" cp `+src+" "+id+":/workspace/src")
	t.Logf("cp up: %s", strings.TrimSpace(out))
	if got := inSandbox("/workspace/src"); got != want {
		t.Fatalf("tree in the sandbox:\n%s\nwant:\n%s", got, want)
	}
	user := strings.TrimSpace(mustDocker(t, "exec", cid, "sh", "-c", "stat -c %U /workspace/src/secret /workspace/src/empty/deeper | sort -u"))
	if lu := strings.TrimSpace(mustDocker(t, "exec", cid, "sh", "-c", "stat -c %U /workspace")); user != lu {
		t.Errorf("copied files belong to %q, the workspace to %q", user, lu)
	}
	if got := strings.TrimSpace(mustDocker(t, "exec", cid, "/workspace/src/run")); got != "ran" {
		t.Errorf("running the copied script through its symlink: %q", got)
	}

	// Down, as a path, and beside it docker cp of the same directory.
	mustCpShell(t, o.base, tok, `"$ORCH" cp `+id+":/workspace/src "+tmp+"/down && docker cp "+cid+":/workspace/src "+tmp+"/docker-down")
	for _, d := range []string{"down", "docker-down"} {
		if got := mustCpShell(t, o.base, tok, "cd "+tmp+"/"+d+" && "+listTree); got != want {
			t.Errorf("%s:\n%s\nwant:\n%s", d, got, want)
		}
	}

	// Through - with the system tar, both ways.
	mustDocker(t, "exec", cid, "mkdir", "-p", "/workspace/piped")
	mustCpShell(t, o.base, tok, "tar -C "+src+` -cf - . | "$ORCH" cp - `+id+":/workspace/piped")
	if got := inSandbox("/workspace/piped"); got != want {
		t.Errorf("tar | cp - : tree in the sandbox:\n%s\nwant:\n%s", got, want)
	}
	mustCpShell(t, o.base, tok, "mkdir "+tmp+`/untar && "$ORCH" cp `+id+":/workspace/piped - | tar -C "+tmp+"/untar -xf -")
	if got := mustCpShell(t, o.base, tok, "cd "+tmp+"/untar/piped && "+listTree); got != want {
		t.Errorf("cp - | tar x:\n%s\nwant:\n%s", got, want)
	}

	// A hostile archive through - is refused and leaves nothing.
	mustCpShell(t, o.base, tok, "mkdir -p "+tmp+"/evil/sub && echo x > "+tmp+"/evil/sub/x")
	out, err := cpShell(t, o.base, tok, "tar -C "+tmp+`/evil -cf - sub/x --transform 's,^sub/,../,' | "$ORCH" cp - `+id+":/workspace/piped")
	if err == nil || !strings.Contains(out, "escapes the target directory") {
		t.Errorf("a tar with ../x: %v %q", err, out)
	}
	if got := mustDocker(t, "exec", cid, "sh", "-c", "ls -A /workspace; ls -A / | grep -c '^x$' || true"); strings.Contains(got, ".berth-archive") || !strings.HasSuffix(strings.TrimSpace(got), "\n0") {
		t.Errorf("a refused archive left something: %q", got)
	}
	o.mustRelease(t, id)
}
