package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkCpDir10k copies a tree of 10,000 files of 1 KiB in 100
// directories into and out of ONE berth/base sandbox with the real binary,
// `orchestrator cp DIR LEASE:/workspace/…` and back, beside `docker cp` of
// the same tree to and from the same container, each iteration one round of
// each, interleaved (the order alternates). Every copy goes to a new path
// and is checked (the entry count, outside the timing); the copies are
// removed between rounds. It reports the median seconds of each and docker
// cp time / orchestrator cp time up and down (> 1: berth faster). At most
// maxRounds rounds run whatever b.N is:
//
//	go test -run '^$' -bench CpDir10k -benchtime 3x ./e2e/
func BenchmarkCpDir10k(b *testing.B) {
	const maxRounds = 5
	requireImage(b, baseImage)
	dir, _ := newDataDir(b)
	o := startOrch(b, dir)
	r := o.mustAcquire(b, "bench-cpdir", baseImage, "1800s")
	id, tok, cid := r.GetLease().GetId(), r.GetToken(), r.GetLease().GetContainerId()

	tmp := b.TempDir()
	src := filepath.Join(tmp, "tree")
	body := []byte(strings.Repeat("x", 1023) + "\n")
	for d := range 100 {
		dd := filepath.Join(src, fmt.Sprintf("d%03d", d))
		if err := os.MkdirAll(dd, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 100 {
			if err := os.WriteFile(filepath.Join(dd, fmt.Sprintf("f%03d.txt", f)), body, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	const wantFiles = "10000"
	countLocal := func(what, p string) {
		b.StopTimer()
		defer b.StartTimer()
		if got := strings.TrimSpace(mustCpShell(b, o.base, tok, "find "+p+" -type f | wc -l")); got != wantFiles {
			b.Fatalf("%s: %s files in %s, want %s", what, got, p, wantFiles)
		}
	}
	countSandbox := func(what, p string) {
		b.StopTimer()
		defer b.StartTimer()
		if got := strings.TrimSpace(mustDocker(b, "exec", cid, "sh", "-c", "find "+p+" -type f | wc -l")); got != wantFiles {
			b.Fatalf("%s: %s files in the sandbox's %s, want %s", what, got, p, wantFiles)
		}
	}
	times := map[string][]time.Duration{}
	timed := func(name, script string) {
		t0 := time.Now()
		out, err := cpShell(b, o.base, tok, script)
		d := time.Since(t0)
		if err != nil {
			b.Fatalf("%s: %s: %v\n%s", name, script, err, out)
		}
		times[name] = append(times[name], d)
	}
	round := func(tool string, i int) {
		in := fmt.Sprintf("/workspace/%s-%d", tool, i)
		out := filepath.Join(tmp, fmt.Sprintf("%s-%d", tool, i))
		up, down := `"$ORCH" cp `+src+" "+id+":"+in, `"$ORCH" cp `+id+":"+in+" "+out
		if tool == "docker" {
			up, down = "docker cp "+src+" "+cid+":"+in, "docker cp "+cid+":"+in+" "+out
		}
		timed(tool+"-up", up)
		countSandbox(tool+" up", in)
		timed(tool+"-down", down)
		countLocal(tool+" down", out)
		b.StopTimer()
		mustDocker(b, "exec", cid, "rm", "-rf", in)
		os.RemoveAll(out)
		b.StartTimer()
	}

	b.ResetTimer()
	for i := range min(b.N, maxRounds) {
		if i%2 == 0 {
			round("orchestrator", i)
			round("docker", i)
		} else {
			round("docker", i)
			round("orchestrator", i)
		}
	}
	b.StopTimer()
	o.mustRelease(b, id)

	b.ReportMetric(0, "ns/op")
	med := map[string]time.Duration{}
	for _, name := range []string{"orchestrator-up", "orchestrator-down", "docker-up", "docker-down"} {
		med[name] = percentile(times[name], 50)
		b.ReportMetric(med[name].Seconds(), name+"-s")
	}
	upRatio := med["docker-up"].Seconds() / med["orchestrator-up"].Seconds()
	downRatio := med["docker-down"].Seconds() / med["orchestrator-down"].Seconds()
	b.ReportMetric(upRatio, "docker/berth-up")
	b.ReportMetric(downRatio, "docker/berth-down")
	b.Logf("10,000 files x 1 KiB in 100 dirs, %d rounds, medians: orchestrator cp up %s down %s | docker cp up %s down %s | docker cp / orchestrator cp: up %.2fx down %.2fx",
		len(times["docker-up"]), med["orchestrator-up"].Round(time.Millisecond), med["orchestrator-down"].Round(time.Millisecond),
		med["docker-up"].Round(time.Millisecond), med["docker-down"].Round(time.Millisecond), upRatio, downRatio)
}
