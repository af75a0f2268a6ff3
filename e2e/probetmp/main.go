package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/berth-dev/berth/pkg/runtime/docker"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
)

func main() {
	cli, _ := docker.NewClient()
	rt, err := docker.New(context.Background(), docker.Config{AgentBinary: os.Args[1], Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for round := 0; round < 5; round++ {
		name := fmt.Sprintf("probe-race-%d-%d", time.Now().UnixNano(), round)
		done := make(chan string, 1)
		go func() {
			r, err := cli.ContainerCreate(ctx, &container.Config{Image: "berth/minimal", Cmd: []string{"sleep", "1"}, Labels: map[string]string{"dev.berth.e2e.run": "probe", "dev.berth.managed": "true"}}, nil, nil, nil, name)
			if err != nil {
				done <- "err " + err.Error()
				return
			}
			done <- r.ID
		}()
		t0 := time.Now()
		for {
			l, _ := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("name", name))})
			if len(l) > 0 {
				_, ierr := cli.ContainerInspect(ctx, l[0].ID)
				t1 := time.Now()
				rerr := rt.Remove(ctx, l[0].ID)
				fmt.Printf("round %d: listed after %s, inspect err: %v; rt.Remove took %s: %v\n", round, t1.Sub(t0), ierr != nil, time.Since(t1), rerr)
				break
			}
		}
		id := <-done
		time.Sleep(200 * time.Millisecond)
		_, ierr := cli.ContainerInspect(ctx, id)
		fmt.Printf("   create returned %.12s after %s; exists afterwards: %v\n", id, time.Since(t0), ierr == nil)
		_ = cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true})
	}
}
