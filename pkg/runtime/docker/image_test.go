package docker_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/berth-dev/berth/internal/testsupport/testenv"
)

// imageToolsScript checks, as the sandbox user, what agents use first in
// berth/base: the whole Python standard library with venv and pip, a
// preview server, and the command-line tools of images/base/packages.txt.
const imageToolsScript = `set -eu
test "$(id -un) $(id -u):$(id -g) $HOME" = "sandbox 1000:1000 /home/sandbox"
test "$(stat -c %u:%g /workspace)" = 1000:1000
cd /workspace && touch owned && rm owned
python3 -m venv /tmp/v && /tmp/v/bin/pip --version
echo '{"a": [1, 2]}' | python3 -m json.tool >/dev/null
mkdir -p /tmp/www && echo hello-berth >/tmp/www/index.html
python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www >/tmp/http.log 2>&1 &
for i in $(seq 100); do curl -fsS -o /tmp/got http://127.0.0.1:8000/index.html 2>/dev/null && break; sleep 0.1; done
grep -qx hello-berth /tmp/got
kill $!
rg --version | head -n1
jq --version
echo '{"k": "v"}' | jq -r .k | grep -qx v
curl --version | head -n1
git --version
for t in make patch diff find ps less unzip xz; do command -v $t >/dev/null || { echo "missing $t"; exit 1; }; done
# pip install as the sandbox user, without a venv or root: a wheel with a
# module and a console script (built here: the sandbox has no network).
python3 - <<'PY'
import zipfile
files = {
    "berth_hello/__init__.py": "def main():\n    print('pip-user-ok')\n",
    "berth_hello-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: berth-hello\nVersion: 1.0\n",
    "berth_hello-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: berth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    "berth_hello-1.0.dist-info/entry_points.txt": "[console_scripts]\nberth-hello = berth_hello:main\n",
}
record = "".join(f"{n},,\n" for n in files) + "berth_hello-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile("/tmp/berth_hello-1.0-py3-none-any.whl", "w") as z:
    for n, c in files.items():
        z.writestr(n, c)
    z.writestr("berth_hello-1.0.dist-info/RECORD", record)
PY
pip install --no-index --no-cache-dir /tmp/berth_hello-1.0-py3-none-any.whl >/tmp/pip.log 2>&1 || { cat /tmp/pip.log; exit 1; }
cd / && berth-hello && python3 -c 'import berth_hello'
echo ALL-OK
`

// runScript runs script with bash in one container of ref as user, without
// a network, and returns its combined output and exit code. The container
// is removed at cleanup, even on failure.
func runScript(t *testing.T, ref, user, script string) (string, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := dockerCli.ContainerCreate(ctx,
		&container.Config{Image: ref, User: user, Cmd: []string{"bash", "-c", script}, Labels: map[string]string{"dev.berth.test": t.Name()}},
		&container.HostConfig{NetworkMode: "none"}, nil, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dockerCli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}); err != nil {
			t.Errorf("remove container %s: %v", c.ID, err)
		}
	})
	waitC, errC := dockerCli.ContainerWait(ctx, c.ID, container.WaitConditionNextExit)
	if err := dockerCli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	var code int64
	select {
	case w := <-waitC:
		code = w.StatusCode
	case err := <-errC:
		t.Fatalf("wait for %s: %v", ref, err)
	}
	rc, err := dockerCli.ContainerLogs(ctx, c.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out bytes.Buffer
	if _, err := stdcopy.StdCopy(&out, &out, rc); err != nil {
		t.Fatal(err)
	}
	return out.String(), code
}

// TestBaseImageTools runs one container of berth/base (make images) and
// checks the tools agents need, as the sandbox user.
func TestBaseImageTools(t *testing.T) {
	requireDocker(t)
	if !imagePresent(t, baseImage) {
		testenv.SkipOrFailf(t, "%s is not present (make images)", baseImage)
	}
	t0 := time.Now()
	out, code := runScript(t, baseImage, "sandbox", imageToolsScript)
	t.Logf("%s in %s:\n%s", baseImage, time.Since(t0).Round(time.Millisecond), out)
	if code != 0 || !strings.Contains(out, "pip-user-ok") || !strings.Contains(out, "ALL-OK") {
		t.Fatalf("exit %d", code)
	}
}

// TestDevImageTools checks the C/C++ compilers and node/npm of berth/dev (make images-dev),
// which `make images` does not build: absent, the test skips.
func TestDevImageTools(t *testing.T) {
	requireDocker(t)
	const devImage = "berth/dev:latest"
	if !imagePresent(t, devImage) {
		t.Skipf("%s is not present (make images-dev)", devImage)
	}
	script := `set -eu
cd /tmp
printf '#include <stdio.h>\nint main(void){puts("c-ok");return 0;}\n' >a.c && gcc -o a a.c && ./a
printf '#include <iostream>\nint main(){std::cout<<"cxx-ok"<<std::endl;}\n' >b.cc && g++ -o b b.cc && ./b
node -e 'console.log("node-ok")'
npm --version
test "$(id -un)" = sandbox
# npm install -g as the sandbox user (a package packed here: no network).
mkdir -p /tmp/jsp && cd /tmp/jsp
printf '{"name":"berth-hello","version":"1.0.0","bin":{"berth-hello-js":"i.js"}}' >package.json
printf '#!/usr/bin/env node\nconsole.log("npm-user-ok")\n' >i.js
npm pack --offline >/dev/null 2>&1 && npm install -g --offline ./berth-hello-1.0.0.tgz >/tmp/npm.log 2>&1 || { cat /tmp/npm.log; exit 1; }
cd / && berth-hello-js
echo ALL-OK
`
	t0 := time.Now()
	out, code := runScript(t, devImage, "sandbox", script)
	t.Logf("%s in %s:\n%s", devImage, time.Since(t0).Round(time.Millisecond), out)
	for _, want := range []string{"c-ok", "cxx-ok", "node-ok", "npm-user-ok", "ALL-OK"} {
		if !strings.Contains(out, want) {
			t.Fatalf("exit %d, %q missing", code, want)
		}
	}
}
