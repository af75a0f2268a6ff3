package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/cmd/orchestrator/internal/backend"
	"github.com/berth-dev/berth/cmd/orchestrator/internal/config"
	"github.com/berth-dev/berth/internal/logx"
	"github.com/berth-dev/berth/pkg/orchestrator"
)

// newServeCommand is "orchestrator serve": it loads the configuration
// (defaults < file < BERTH_* environment < flags; one flag per setting,
// see docs/configuration.md) and runs the daemon until SIGTERM or SIGINT.
// It exits 2 for a configuration error and 1 when the server cannot start
// or fails.
func newServeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Run the orchestrator daemon",
		Long: `Run the orchestrator daemon: the lease API (gRPC and REST), the sandbox proxy
and /metrics on one listener, until SIGTERM or SIGINT.

Every setting can be given in a JSON file (--config or BERTH_CONFIG), as a
BERTH_* environment variable or as a flag; later sources win: defaults <
file < environment < flags. Sizes take bytes or quantities (512Mi, 10Gi,
2G), durations Go's notation (90s, 10m, 1h). The secrets have no flag,
since a command line is visible to every user of the host.

Exit codes: 0 after a clean shutdown, 1 when the server cannot start or
fails, 2 for a mistake in the configuration.`,
		Example: `  BERTH_OPERATOR_TOKEN=secret orchestrator serve --data-dir /var/lib/berth
  orchestrator serve --config /etc/berth/orchestrator.json --log-format json
  orchestrator serve --runtime containerd --userns --default-memory-bytes 1Gi`,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	flags := config.AddFlags(cmd.Flags())
	cmd.SetUsageFunc(serveUsage)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return configError(cmd.ErrOrStderr(), fmt.Errorf("serve: unexpected arguments %q", args))
		}
		cfg, err := flags.Load(os.Getenv)
		if err != nil {
			return configError(cmd.ErrOrStderr(), err)
		}
		if code := serve(cfg); code != 0 {
			return exitCode(code)
		}
		return nil
	}
	return cmd
}

// serveUsage is cobra's usage with the flags listed by group.
func serveUsage(c *cobra.Command) error {
	w := c.OutOrStderr()
	fmt.Fprintf(w, "Usage:\n  %s\n", c.UseLine())
	if c.HasExample() {
		fmt.Fprintf(w, "\nExamples:\n%s\n", c.Example)
	}
	fmt.Fprintf(w, "\n%s", config.FlagUsages(c.LocalFlags()))
	if c.HasAvailableInheritedFlags() {
		fmt.Fprintf(w, "\nGlobal Flags:\n%s", c.InheritedFlags().FlagUsages())
	}
	return nil
}

// configError prints err and returns exit code 2.
func configError(w io.Writer, err error) error {
	fmt.Fprintln(w, "orchestrator:", err)
	return exitCode(2)
}

// exitCode is an error that carries the process's exit code; the message
// has been printed already.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// ExitCode is the process's exit code.
func (e exitCode) ExitCode() int { return int(e) }

// serve runs the daemon with cfg and returns the exit code.
func serve(cfg orchestrator.Config) int {
	log, err := logx.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "orchestrator:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	b, err := backend.New(pctx, cfg, log)
	cancel()
	if err != nil {
		log.Error("cannot start the runtime", "runtime", cfg.Runtime, "err", err)
		return 1
	}
	defer b.Runtime.Close()
	srv, err := orchestrator.New(ctx, cfg, b.Platform(), log)
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
	e2bDone := make(chan error, 1)
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	if cfg.E2BListen != "" {
		eln, err := net.Listen("tcp", cfg.E2BListen)
		if err != nil {
			_ = ln.Close()
			log.Error("cannot listen", "e2b_addr", cfg.E2BListen, "err", err)
			return 1
		}
		orchestrator.WarnExposure(log, eln.Addr())
		go func() {
			err := srv.ServeE2B(sctx, eln)
			if err != nil {
				log.Error("e2b serve failed", "err", err)
			}
			stopServing() // the main listener ends with the E2B one
			e2bDone <- err
		}()
	} else {
		e2bDone <- nil
	}
	err = srv.Serve(sctx, ln)
	stopServing() // the E2B listener ends with the main one
	if eerr := <-e2bDone; err == nil {
		err = eerr
	}
	if err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}
