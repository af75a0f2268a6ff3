// Command orchestrator is the berth daemon and its operator/CI command line.
//
//	orchestrator serve [--listen 127.0.0.1:7070] [--data-dir DIR] [--config FILE] ...
//	orchestrator lease acquire|get|list|renew|release|reap|watch [flags]
//	orchestrator exec LEASE -- CMD [ARGS...]   (exits with the command's code)
//	orchestrator cp SRC DST                    (LEASE:/abs/path on one side)
//	orchestrator git status|diff LEASE [REPO]
//	orchestrator version
//	orchestrator completion bash|zsh|fish
//
// Client commands take --addr (BERTH_ADDR, default http://127.0.0.1:7070)
// and --token (BERTH_TOKEN, else BERTH_OPERATOR_TOKEN). Every command has
// --help with examples; docs/cli.md describes them all. Exit codes: 0
// success, 1 error, 2 usage mistake; exec exits with the command's code.
package main

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/cmd/orchestrator/internal/cli"
)

func main() {
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	os.Exit(cli.Execute(context.Background(), cli.NewRoot(env, serveCommand()), os.Args[1:], env))
}

// serveCommand is newServeCommand with its exit code passed to cli.Execute
// (serve reports its own errors).
func serveCommand() *cobra.Command {
	cmd := newServeCommand()
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		err := run(c, args)
		var code exitCode
		if errors.As(err, &code) {
			return cli.ExitError(int(code))
		}
		return err
	}
	return cmd
}
