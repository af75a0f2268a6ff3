package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
)

// gitTimeout bounds one git call.
const gitTimeout = 2 * time.Minute

// gitOptions are the flags of `git status|diff`.
type gitOptions struct {
	sandboxFlags
	file, ref string
}

// newGitCommand is `orchestrator git status|diff`.
func newGitCommand(env Env) *cobra.Command {
	o := &gitOptions{}
	cmd := newGroup("git", "Show the git status or diff of a repository in a lease's sandbox",
		`  orchestrator git status LEASE /workspace/repo
  orchestrator git diff LEASE /workspace/repo
  orchestrator git diff --file main.go --ref HEAD~1 LEASE /workspace/repo -o json`,
		o.newStatusCommand(env), o.newDiffCommand(env))
	o.register(cmd.PersistentFlags(), env, false)
	cmd.PersistentFlags().StringVar(&o.file, "file", "", "diff: one file's original and modified text")
	cmd.PersistentFlags().StringVar(&o.ref, "ref", "", "diff: compare with this ref (default HEAD)")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error { return checkOutput(o.output) }
	return cmd
}

// gitArgs is LEASE [REPO].
func gitArgs(_ *cobra.Command, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return usagef("want LEASE [REPO], got %d arguments", len(args))
	}
	return nil
}

func (o *gitOptions) newStatusCommand(env Env) *cobra.Command {
	return &cobra.Command{
		Use:     "status LEASE [REPO]",
		Short:   "Show the branch and the changed files",
		Example: `  orchestrator git status LEASE /workspace/repo`,
		Args:    gitArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.call(cmd.Context(), env, args, func(ctx context.Context, g agentv1.GitServiceClient, repo string) (proto.Message, error) {
				st, err := g.Status(ctx, &agentv1.GitStatusRequest{Repo: repo})
				if err == nil && isTable(o.output) {
					printGitStatus(env.Stdout, st)
					return nil, nil
				}
				return st, err
			})
		},
	}
}

func (o *gitOptions) newDiffCommand(env Env) *cobra.Command {
	return &cobra.Command{
		Use:   "diff LEASE [REPO] [--file F] [--ref R]",
		Short: "Show the unified diff (or one file's two versions)",
		Example: `  orchestrator git diff LEASE /workspace/repo
  orchestrator git diff --file main.go LEASE /workspace/repo`,
		Args: gitArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.call(cmd.Context(), env, args, func(ctx context.Context, g agentv1.GitServiceClient, repo string) (proto.Message, error) {
				d, err := g.Diff(ctx, &agentv1.GitDiffRequest{Repo: repo, File: o.file, Ref: o.ref})
				if err == nil && isTable(o.output) {
					printGitDiff(env.Stdout, d, o.file != "")
					return nil, nil
				}
				return d, err
			})
		},
	}
}

// call opens the sandbox named by args[0] and runs fn on args[1] (the
// repository, "" for the default); a message fn returns is printed as
// json or yaml.
func (o *gitOptions) call(ctx context.Context, env Env, args []string, fn func(context.Context, agentv1.GitServiceClient, string) (proto.Message, error)) error {
	repo := ""
	if len(args) == 2 {
		repo = args[1]
	}
	sc, err := o.open(ctx, args[0])
	if err != nil {
		return err
	}
	defer sc.conn.Close()
	ctx, cancel := context.WithTimeout(sc.ctx, gitTimeout)
	defer cancel()
	msg, err := fn(ctx, agentv1.NewGitServiceClient(sc.conn), repo)
	if err != nil || msg == nil {
		return fail(err)
	}
	return fail(printMessage(env.Stdout, o.output, msg))
}

func isTable(format string) bool { return format == outTable || format == outWide }

func printGitStatus(w io.Writer, st *agentv1.GitStatusResponse) {
	fmt.Fprintf(w, "branch %s (ahead %d, behind %d)\n", safe(st.Branch), st.Ahead, st.Behind)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range st.Files {
		kind := strings.TrimPrefix(f.Kind.String(), "CHANGE_KIND_")
		if f.OldPath != "" {
			fmt.Fprintf(tw, "%s\t%s -> %s\n", kind, safe(f.OldPath), safe(f.Path))
		} else {
			fmt.Fprintf(tw, "%s\t%s\n", kind, safe(f.Path))
		}
	}
	tw.Flush()
}

func printGitDiff(w io.Writer, d *agentv1.GitDiffResponse, oneFile bool) {
	if oneFile && d.Unified == "" {
		if d.Binary {
			fmt.Fprintf(w, "%s: binary file differs\n", safe(d.Path))
			return
		}
		fmt.Fprintf(w, "--- original %s\n%s\n+++ modified %s\n%s", d.Path, d.Original, d.Path, d.Modified)
		return
	}
	fmt.Fprint(w, d.Unified)
}
