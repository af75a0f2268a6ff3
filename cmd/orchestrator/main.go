// Command orchestrator is the berth daemon and its operator/CI command line.
//
//	orchestrator serve [--listen 127.0.0.1:7070] [--data-dir DIR] [--config FILE] ...
//	orchestrator lease acquire|get|list|renew|release|reap|watch [flags]
//	orchestrator exec LEASE -- CMD [ARGS...]   (exits with the command's code)
//	orchestrator cp SRC DST                    (LEASE:/abs/path on one side)
//	orchestrator git status|diff LEASE [REPO]
//	orchestrator version
//
// Client commands take --addr (BERTH_ADDR, default http://127.0.0.1:7070)
// and --token (BERTH_TOKEN, else BERTH_OPERATOR_TOKEN).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/berth-dev/berth/cmd/orchestrator/internal/cli"
	"github.com/berth-dev/berth/internal/version"
)

const usage = `usage:
  orchestrator serve [--listen ADDR] [--data-dir DIR] [--config FILE] [flags]
  orchestrator lease acquire|get|list|renew|release|reap|watch [flags]
  orchestrator exec [--cwd DIR] [--timeout D] [--stdin] [--sh] LEASE -- CMD [ARGS...]
  orchestrator cp [--parents] SRC DST      (one side LEASE:/abs/path, the other a local path or -)
  orchestrator git status|diff [--file F] [--ref R] LEASE [REPO]
  orchestrator version
Run "orchestrator serve -h" or "orchestrator lease acquire -h" for flags.`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, usage)
		return 2
	}
	env := cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv}
	switch args[0] {
	case "serve":
		cmd := newServeCommand()
		cmd.SetArgs(args[1:])
		if err := cmd.Execute(); err != nil {
			if code, ok := err.(exitCode); ok {
				return int(code)
			}
			return 1
		}
		return 0
	case "lease":
		return cli.RunLease(context.Background(), args[1:], env)
	case "exec":
		return cli.RunExec(context.Background(), args[1:], env, os.Stdin)
	case "cp":
		return cli.RunCp(context.Background(), args[1:], env, os.Stdin)
	case "git":
		return cli.RunGit(context.Background(), args[1:], env)
	case "version", "--version":
		fmt.Println(version.Version)
		return 0
	case "help", "-h", "--help":
		fmt.Println(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "orchestrator: unknown command %q\n%s\n", args[0], usage)
		return 2
	}
}
