package process

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OOMKillCounter returns how many processes the kernel's OOM killer has
// killed in the agent's memory cgroup so far; ok is false when the count
// cannot be read.
type OOMKillCounter func() (n uint64, ok bool)

// cgroupRoot is where cgroup file systems are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// CgroupOOMKills returns a counter reading the oom_kill count of this
// process's memory cgroup — "oom_kill" in memory.events on cgroup v2, in
// memory.oom_control on cgroup v1 — or nil when no such file is readable.
// The cgroup is found through /proc/self/cgroup; when that path does not
// exist under /sys/fs/cgroup (inside a container, where the container's own
// cgroup is mounted at the root) the root's file is used.
//
// Every command reads the count when it starts, so the file is opened once
// and read with one pread from offset 0 (the kernel renders it afresh):
// one system call per read instead of the five of opening, reading and
// closing it.
func CgroupOOMKills() OOMKillCounter {
	self, _ := os.ReadFile("/proc/self/cgroup")
	path := oomFile(cgroupRoot, self)
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return func() (uint64, bool) { return readOOMKill(path) }
	}
	return func() (uint64, bool) { return preadOOMKill(f) }
}

// preadOOMKill reads the "oom_kill N" line of the open memory.events or
// memory.oom_control file f with one pread at offset 0.
func preadOOMKill(f *os.File) (uint64, bool) {
	var buf [1024]byte
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 {
		return 0, false
	}
	if err != nil && n == len(buf) {
		return 0, false // longer than any such file: not one
	}
	return parseOOMKill(buf[:n])
}

// oomFile picks the file holding the oom_kill count, given the cgroup mount
// root and the content of /proc/self/cgroup; "" when there is none.
func oomFile(root string, selfCgroup []byte) string {
	var v1, v2 string // this process's cgroup paths
	sc := bufio.NewScanner(bytes.NewReader(selfCgroup))
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case containsField(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	var candidates []string
	if v1 != "" || fileExists(filepath.Join(root, "memory", "memory.oom_control")) {
		if v1 != "" {
			candidates = append(candidates, filepath.Join(root, "memory", v1, "memory.oom_control"))
		}
		candidates = append(candidates, filepath.Join(root, "memory", "memory.oom_control"))
	}
	if v2 != "" {
		candidates = append(candidates, filepath.Join(root, v2, "memory.events"))
	}
	candidates = append(candidates, filepath.Join(root, "memory.events"))
	for _, c := range candidates {
		if _, ok := readOOMKill(c); ok {
			return c
		}
	}
	return ""
}

func containsField(list, name string) bool {
	for _, f := range strings.Split(list, ",") {
		if f == name {
			return true
		}
	}
	return false
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readOOMKill reads the "oom_kill N" line of a memory.events or
// memory.oom_control file.
func readOOMKill(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseOOMKill(b)
}

// parseOOMKill finds the "oom_kill N" line of a memory.events or
// memory.oom_control file's content.
func parseOOMKill(b []byte) (uint64, bool) {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// sigkillExit is the exit status a shell reports for a child killed by SIGKILL.
const sigkillExit = 128 + 9

// oomVerdict applies the OOM heuristic to a finished command: it was
// OOM-killed when it (or, for a shell, its last command: exit status 137)
// died of a SIGKILL the agent did not send, and the cgroup's oom_kill count
// rose during its life.
func (p *proc) oomVerdict(st ExitStatus) bool {
	if !p.oomKnown || p.agentKilled.Load() || p.r.cfg.OOMKills == nil {
		return false
	}
	if st.Signal != "SIGKILL" && st.ExitCode != sigkillExit {
		return false
	}
	n, ok := p.r.cfg.OOMKills()
	return ok && n > p.oomBefore
}
