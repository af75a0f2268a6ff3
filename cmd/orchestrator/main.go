// Command orchestrator is the berth daemon and its operator/CI command line.
//
//	orchestrator serve [--listen 127.0.0.1:7070] [--data-dir DIR] [--config FILE] ...
//	orchestrator drain --mode hibernate|release  (take the host out of service)
//	orchestrator lease acquire|get|list|renew|release|reap|watch [flags]
//	orchestrator exec LEASE -- CMD [ARGS...]   (exits with the command's code)
//	orchestrator shell LEASE [-- CMD ...]      (an interactive terminal)
//	orchestrator cp SRC DST                    (LEASE:/abs/path on one side)
//	orchestrator git status|diff LEASE [REPO]
//	orchestrator version
//	orchestrator completion bash|zsh|fish
//
// Client commands take --addr (BERTH_ADDR, default http://127.0.0.1:7070)
// and --token (BERTH_TOKEN, else BERTH_OPERATOR_TOKEN). Every command has
// --help with examples; docs/cli.md describes them all. Exit codes: 0
// success, 1 error, 2 usage mistake; exec and shell exit with the
// program's code (124 timed out, 125 exec failed, 126 cannot execute, 127
// not found).
package main

import (
	"context"
	"os"

	"github.com/berth-dev/berth/cmd/orchestrator/internal/cli"
)

func main() {
	env := cli.Env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, LookupEnv: os.LookupEnv}
	os.Exit(cli.Execute(context.Background(), cli.NewRoot(env, newServeCommand()), os.Args[1:], env))
}
