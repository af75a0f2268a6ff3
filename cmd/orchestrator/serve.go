package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/internal/logx"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// newServeCommand is "orchestrator serve": it loads the configuration
// (defaults < file < BERTH_* environment < flags) and runs the daemon until
// SIGTERM or SIGINT.
func newServeCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "serve [flags]",
		Short:              "Run the orchestrator daemon",
		DisableFlagParsing: true,
		SilenceErrors:      true,
		SilenceUsage:       true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := serve(args); code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
}

// exitCode is an error that carries the process's exit code.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func serve(args []string) int {
	cfg, err := orchestrator.LoadConfig(args, os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orchestrator:", err)
		return 2
	}
	log, err := logx.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orchestrator:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	rt, err := orchestrator.NewRuntime(pctx, cfg, log)
	cancel()
	if err != nil {
		log.Error("cannot start the runtime", "runtime", cfg.Runtime, "err", err)
		return 1
	}
	defer rt.Close()
	srv, err := orchestrator.New(ctx, cfg, rt, log)
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	defer srv.Close()
	if cfg.OperatorToken == "" && len(cfg.Clients) == 0 {
		log.Warn("no BERTH_OPERATOR_TOKEN and no client tokens: only lease tokens will work and nobody can acquire")
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Listen, "err", err)
		return 1
	}
	orchestrator.WarnExposure(log, ln.Addr())
	if err := srv.Serve(ctx, ln); err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}
