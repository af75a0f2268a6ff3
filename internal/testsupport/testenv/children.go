package testenv

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// NoChildrenLeft is for TestMain of packages that start processes: when
// the tests passed (code 0), it waits up to grace for every child of the
// test process to end and turns code into 1, naming them on stderr, if some
// are still alive (zombies do not count). Use it as
// os.Exit(testenv.NoChildrenLeft(m.Run(), 3*time.Second)).
func NoChildrenLeft(code int, grace time.Duration) int {
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(grace)
	for {
		left := LiveChildren()
		if len(left) == 0 {
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "child processes left behind: %v\n", left)
			return 1
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LiveChildren lists the live (not zombie) children of this process as
// "PID(command line)".
func LiveChildren() []string {
	self := os.Getpid()
	return LiveProcs(func(_, ppid, _ int) bool { return ppid == self })
}

// LiveProcs lists the live (not zombie) processes of the host, as
// "PID(command line)", for which match(pid, ppid, pgid) is true.
func LiveProcs(match func(pid, ppid, pgid int) bool) []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgid, _ := strconv.Atoi(f[2])
		if !match(pid, ppid, pgid) {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		out = append(out, fmt.Sprintf("%d(%s)", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
	}
	return out
}
