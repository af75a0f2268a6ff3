package docker

import (
	"archive/tar"
	"bufio"
	"context"
	"io"
	"strconv"
	"strings"
)

// resolveOwner returns the uid and gid the image's user spec ("", "name",
// "uid", "name:group", "uid:gid") stands for, reading the created container's
// /etc/passwd and /etc/group only when a name must be resolved. Whatever
// cannot be resolved falls back to 0 (root): the engine then refuses to start
// a container whose user does not exist, which Create reports.
func (r *Runtime) resolveOwner(ctx context.Context, id, user string) (uid, gid int) {
	u, g, _ := strings.Cut(user, ":")
	if u == "" || u == "root" || u == "0" {
		if g == "" {
			return 0, 0
		}
	}
	uid, uNum := atoiNonNeg(u)
	if u == "" || u == "root" {
		uid, uNum = 0, true
	}
	gid, gNum := atoiNonNeg(g)
	primary := -1
	if !uNum || g == "" {
		for _, f := range r.readEtc(ctx, id, "/etc/passwd") {
			// name:x:uid:gid:gecos:home:shell
			if len(f) < 4 {
				continue
			}
			fu, ok1 := atoiNonNeg(f[2])
			fg, ok2 := atoiNonNeg(f[3])
			if !ok1 || !ok2 {
				continue
			}
			if (!uNum && f[0] == u) || (uNum && fu == uid) {
				uid, uNum, primary = fu, true, fg
				break
			}
		}
		if !uNum {
			return 0, 0
		}
	}
	switch {
	case g == "":
		gid = max(primary, 0)
	case !gNum:
		gid = 0
		for _, f := range r.readEtc(ctx, id, "/etc/group") {
			// name:x:gid:members
			if len(f) >= 3 && f[0] == g {
				if n, ok := atoiNonNeg(f[2]); ok {
					gid = n
				}
				break
			}
		}
	}
	return uid, gid
}

func atoiNonNeg(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0
}

// readEtc returns the colon-separated fields of each line of path in the
// container, or nil when it cannot be read (e.g. an image without it).
func (r *Runtime) readEtc(ctx context.Context, id, path string) [][]string {
	rc, _, err := r.cli.CopyFromContainer(ctx, id, path)
	if err != nil {
		return nil
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	if _, err := tr.Next(); err != nil {
		return nil
	}
	var out [][]string
	sc := bufio.NewScanner(io.LimitReader(tr, 1<<20))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}
