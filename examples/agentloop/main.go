// Command agentloop is a tiny scripted agent loop that runs the same task
// against a Workspace chosen by a flag: the local host, or a leased berth
// sandbox through the orchestrator. It prints the same report for both —
// the proof that the loop does not know where it runs.
//
//	go run ./examples/agentloop --workspace local --dir /tmp/ws
//	BERTH_TOKEN=dev-operator-token go run ./examples/agentloop --workspace leased --conversation demo
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/berth-dev/berth/pkg/workspace"
)

func main() {
	kind := flag.String("workspace", "local", "local or leased")
	dir := flag.String("dir", "", "local: workspace directory (default: a new temp dir)")
	addr := flag.String("addr", envOr("BERTH_ADDR", "http://127.0.0.1:7070"), "leased: orchestrator address")
	token := flag.String("token", envOr("BERTH_TOKEN", os.Getenv("BERTH_OPERATOR_TOKEN")), "leased: client or operator token")
	conv := flag.String("conversation", "agentloop", "leased: conversation id")
	image := flag.String("image", "berth/base", "leased: image")
	keep := flag.Bool("keep", false, "leased: keep the lease on exit")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ws, err := open(ctx, *kind, *dir, *addr, *token, *conv, *image, *keep)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
	err = runTask(ctx, ws, os.Stdout)
	if cerr := ws.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentloop:", err)
		os.Exit(1)
	}
}

func open(ctx context.Context, kind, dir, addr, token, conv, image string, keep bool) (workspace.Workspace, error) {
	switch kind {
	case "local":
		if dir == "" {
			d, err := os.MkdirTemp("", "agentloop-")
			if err != nil {
				return nil, err
			}
			dir = d
		}
		return workspace.NewLocal(dir)
	case "leased":
		return workspace.NewLeased(ctx, workspace.LeasedConfig{
			OrchestratorAddr: addr, Token: token, ConversationID: conv, Image: image,
			TTL: 10 * time.Minute, KeepOnClose: keep,
		})
	}
	return nil, fmt.Errorf("--workspace: want local or leased, got %q", kind)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
