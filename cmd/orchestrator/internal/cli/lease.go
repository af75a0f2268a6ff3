package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/berth-dev/berth/internal/quantity"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// callTimeout bounds one lease call (an acquire waits for the sandbox).
const callTimeout = 5 * time.Minute

// leaseFlags are the flags of every lease subcommand.
type leaseFlags struct {
	clientFlags
	output string
}

// newLeaseCommand is `orchestrator lease`.
func newLeaseCommand(env Env) *cobra.Command {
	lf := &leaseFlags{}
	cmd := newGroup("lease", "Acquire, inspect, renew, pause, resume and release leases",
		`  orchestrator lease acquire --conversation ci-42 --memory 2Gi --disk 10Gi --cpus 1.5
  orchestrator lease list -o wide
  orchestrator lease get LEASE -o yaml
  orchestrator lease release LEASE --reason done`,
		newAcquireCommand(env, lf), newGetCommand(env, lf), newListCommand(env, lf), newRenewCommand(env, lf),
		newPauseCommand(env, lf), newResumeCommand(env, lf), newLeaseSnapshotCommand(env, lf), newReleaseCommand(env, lf), newReapCommand(env, lf), newWatchCommand(env, lf),
		newSignCommand(env, lf), newTopCommand(env, lf), newLeaseNetworkCommand(env, lf))
	return lf.registerGroup(cmd, env)
}

// registerGroup adds the client flags and -o to a command group's
// persistent flags, and checks -o before any subcommand runs.
func (lf *leaseFlags) registerGroup(cmd *cobra.Command, env Env) *cobra.Command {
	lf.register(cmd.PersistentFlags(), env)
	addOutputFlag(cmd.PersistentFlags(), &lf.output)
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error { return checkOutput(lf.output) }
	return cmd
}

// call dials the orchestrator, runs fn with the token and a deadline, and
// prints its answer in the -o format.
func (lf *leaseFlags) call(ctx context.Context, env Env, fn func(context.Context, orchv1.LeaseServiceClient) (proto.Message, error)) error {
	return callPrint(ctx, env, lf, orchv1.NewLeaseServiceClient, fn, nil)
}

func newAcquireCommand(env Env, lf *leaseFlags) *cobra.Command {
	var (
		conv, image, owner, user string
		snapshot                 string
		idlePolicy               string
		ttl, idle                time.Duration
		cpus                     quantity.CPUs
		mem, disk                quantity.Bytes
		pids                     int64
		labels                   = labelFlag{}
		secrets, secretEnv       []string
		persist                  bool      // volume.go
		mounts                   mountFlag // volume.go
	)
	var netf networkFlags // network.go
	cmd := &cobra.Command{
		Use:   "acquire --conversation ID [flags]",
		Short: "Acquire a lease on a new sandbox (or the conversation's existing one)",
		Long: `Acquire a lease on a sandbox for a conversation. An acquire for a conversation
that already holds a live lease returns that lease. The answer carries the
lease's token, which exec, cp and git use (BERTH_TOKEN).

Sizes take units: --memory 2Gi --disk 10Gi (Ki, Mi, Gi, Ti or k, M, G, T; a
plain integer is bytes). --cpus takes CPUs (1.5) or millicpus (500m).

Secrets reach the sandbox's commands as environment variables; the
orchestrator never stores nor shows their values (leases list their names),
and the sandbox's agent prints <secret:NAME> where a command prints a value.
--secret-env NAME takes the value from this environment, which keeps it out
of your shell history and of the process list (--secret NAME=VALUE does
not).`,
		Example: `  orchestrator lease acquire --conversation ci-42
  orchestrator lease acquire --conversation ci-42 --memory 2Gi --disk 10Gi --cpus 1.5 --ttl 30m
  orchestrator lease acquire --conversation ci-42 --label team=infra --label job=build -o json
  orchestrator lease acquire --conversation ci-42 --secret-env GITHUB_TOKEN
  orchestrator lease acquire --conversation c-1 --persist --idle-timeout 10m --idle-policy hibernate
  orchestrator lease acquire --conversation c-1 --mount /srv/projects/app:/workspace/app
  TOKEN=$(orchestrator lease acquire --conversation ci-42 -o json | jq -r .token)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sec, err := secretValues(env, secrets, secretEnv)
			if err != nil {
				return err
			}
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				req := &orchv1.AcquireRequest{ConversationId: conv, Image: image, Labels: labels, Owner: owner, User: user, IdlePolicy: idlePolicy, Snapshot: snapshot,
					Resources: &orchv1.Resources{Cpus: float64(cpus), MemoryBytes: int64(mem), DiskBytes: int64(disk), Pids: pids}, Secrets: sec}
				if persist {
					req.Workspace = &orchv1.Workspace{Persist: true}
				}
				req.Mounts = mounts.mounts
				if netf.set() {
					req.Network = netf.policy() // network.go
				}
				if ttl != 0 {
					req.Ttl = durationpb.New(ttl)
				}
				if idle != 0 {
					req.IdleTimeout = durationpb.New(idle)
				}
				return c.Acquire(ctx, req)
			})
		},
	}
	fs := cmd.Flags()
	netf.register(fs, "network-mode")
	fs.StringVar(&conv, "conversation", "", "conversation id (required)")
	fs.StringVar(&image, "image", "", "image (default: the orchestrator's default image)")
	fs.StringVar(&snapshot, "snapshot", "", "start from this snapshot (lease snapshot): a fork with its files; leave --image empty")
	fs.DurationVar(&ttl, "ttl", 0, "lifetime, e.g. 10m (default: the orchestrator's default)")
	fs.DurationVar(&idle, "idle-timeout", 0, "expire (or pause, see --idle-policy) after this long without activity")
	fs.StringVar(&idlePolicy, "idle-policy", "", "what the idle timeout does: expire, freeze or hibernate (default: the orchestrator's)")
	fs.Var(&cpus, "cpus", "CPU limit: CPUs (1.5) or millicpus (500m)")
	fs.Var(&mem, "memory", "memory limit: 2Gi, 512Mi, 1G or bytes")
	fs.Var(&disk, "disk", "disk limit (writable layer and workspace): 10Gi or bytes")
	fs.Int64Var(&pids, "pids", 0, "process limit")
	fs.StringVar(&owner, "owner", "", "owner (operator token only)")
	fs.StringVar(&user, "user", "", "user the sandbox's commands run as: NAME, UID, NAME:GROUP or UID:GID (default: the orchestrator's default user for berth's images, else the image's user)")
	fs.Var(labels, "label", "label key=value (repeatable)")
	fs.StringArrayVar(&secrets, "secret", nil, "secret `NAME=VALUE` for the sandbox's environment, masked in its output (repeatable; prefer --secret-env)")
	fs.StringArrayVar(&secretEnv, "secret-env", nil, "secret `NAME` whose value is this environment's NAME (repeatable)")
	fs.BoolVar(&persist, "persist", false, "keep /workspace on the conversation's volume: a later acquire of the conversation finds the files (orchestrator volume list)")
	fs.Var(&mounts, "mount", "mount a host path: HOST_PATH:TARGET[:ro] (repeatable; only under prefixes the operator allows)")
	return cmd
}

// secretValues builds an acquire's secrets from --secret NAME=VALUE and
// --secret-env NAME (read from env; an unset one is a usage error). Errors
// never show a value.
func secretValues(env Env, pairs, names []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range pairs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, usagef("--secret: want NAME=VALUE") // the argument may be a bare value: not shown
		}
		out[k] = v
	}
	for _, k := range names {
		v, ok := env.lookupEnv(k)
		if !ok || k == "" {
			return nil, usagef("--secret-env %q: not set in this environment", k)
		}
		out[k] = v
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

func newGetCommand(env Env, lf *leaseFlags) *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "get LEASE",
		Short: "Show one lease",
		Long:  "Show one lease: a table row, then its disk usage and warnings, if any.\n\n" + watchHelp,
		Example: `  orchestrator lease get LEASE
  orchestrator lease get LEASE -o json | jq -r .state
  orchestrator lease get LEASE --watch`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			get := func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.Get(ctx, &orchv1.GetLeaseRequest{Id: args[0]})
			}
			if watch {
				return lf.watchLeases(cmd.Context(), env, &orchv1.WatchRequest{LeaseId: args[0]}, func(ctx context.Context, c orchv1.LeaseServiceClient) ([]*orchv1.Lease, error) {
					l, err := c.Get(ctx, &orchv1.GetLeaseRequest{Id: args[0]})
					return []*orchv1.Lease{l}, err
				}, nil)
			}
			return lf.call(cmd.Context(), env, get)
		},
	}
	addWatchFlag(cmd, &watch, "the lease")
	return cmd
}

func newListCommand(env Env, lf *leaseFlags) *cobra.Command {
	var (
		state, owner, sel, conv string
		all, watch              bool
	)
	cmd := &cobra.Command{
		Use:   "list [flags]",
		Short: "List leases (live ones unless --all)",
		Long: `List the leases the token can see: live ones, or all with --all, filtered by
state, owner, conversation or labels.

` + watchHelp + ` Changes are filtered as the listing is (an
ended lease's last change is shown even without --all).`,
		Example: `  orchestrator lease list
  orchestrator lease list --selector team=infra -o wide
  orchestrator lease list --all --state released -o json
  orchestrator lease list --watch`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := parseState(state)
			if err != nil {
				return err
			}
			req := &orchv1.ListLeasesRequest{State: st, Owner: owner, LabelSelector: sel, ConversationId: conv, IncludeEnded: all, PageSize: 1000}
			list := func(ctx context.Context, c orchv1.LeaseServiceClient) ([]*orchv1.Lease, error) {
				return listAll(ctx, c, req)
			}
			if watch {
				keep, err := leaseFilter(st, conv, sel)
				if err != nil {
					return err
				}
				return lf.watchLeases(cmd.Context(), env, &orchv1.WatchRequest{Owner: owner}, list, keep)
			}
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				leases, err := list(ctx, c)
				return &orchv1.ListLeasesResponse{Leases: leases}, err
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&state, "state", "", "filter by state (PENDING, READY, RELEASING, RELEASED, EXPIRED, FAILED)")
	fs.StringVar(&owner, "owner", "", "filter by owner")
	fs.StringVar(&sel, "selector", "", "label selector k=v,k2=v2")
	fs.StringVar(&conv, "conversation", "", "filter by conversation id")
	fs.BoolVar(&all, "all", false, "include ended leases")
	addWatchFlag(cmd, &watch, "the current leases")
	return cmd
}

// listAll pages through List.
func listAll(ctx context.Context, c orchv1.LeaseServiceClient, req *orchv1.ListLeasesRequest) ([]*orchv1.Lease, error) {
	req = proto.CloneOf(req)
	var out []*orchv1.Lease
	for {
		page, err := c.List(ctx, req)
		if err != nil {
			return nil, err
		}
		out = append(out, page.GetLeases()...)
		if page.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = page.GetNextPageToken()
	}
}

func newRenewCommand(env Env, lf *leaseFlags) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "renew LEASE [--ttl D]",
		Short: "Extend a lease's lifetime",
		Example: `  orchestrator lease renew LEASE
  orchestrator lease renew LEASE --ttl 1h`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				req := &orchv1.RenewRequest{Id: args[0]}
				if ttl != 0 {
					req.Ttl = durationpb.New(ttl)
				}
				return c.Renew(ctx, req)
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "new lifetime from now (default: the lease's ttl)")
	return cmd
}

func newPauseCommand(env Env, lf *leaseFlags) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "pause LEASE [--mode freeze|hibernate]",
		Short: "Pause a lease: freeze its processes, or hibernate it (files kept)",
		Long: `Pause a READY lease. --mode freeze (the default) freezes its processes in
memory (cgroup freezer; not every backend can); --mode hibernate stops its
container, keeping its files and freeing its memory: processes that were
running are gone. Any request through the proxy resumes it.`,
		Example: `  orchestrator lease pause LEASE
  orchestrator lease pause LEASE --mode hibernate -o json`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.Pause(ctx, &orchv1.PauseRequest{Id: args[0], Mode: mode})
			})
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "freeze", "how to pause: freeze or hibernate")
	return cmd
}

func newResumeCommand(env Env, lf *leaseFlags) *cobra.Command {
	return &cobra.Command{
		Use:               "resume LEASE",
		Short:             "Resume a paused lease",
		Example:           `  orchestrator lease resume LEASE -o json`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.Resume(ctx, &orchv1.ResumeRequest{Id: args[0]})
			})
		},
	}
}

func newReleaseCommand(env Env, lf *leaseFlags) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:               "release LEASE [--reason TEXT]",
		Short:             "Release a lease and remove its sandbox",
		Example:           `  orchestrator lease release LEASE --reason "job finished"`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.Release(ctx, &orchv1.ReleaseRequest{Id: args[0], Reason: reason})
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "reason recorded with the release")
	return cmd
}

func newReapCommand(env Env, lf *leaseFlags) *cobra.Command {
	var (
		sel, owner, conv, reason string
		all                      bool
	)
	cmd := &cobra.Command{
		Use:   "reap [LEASE...] [flags]",
		Short: "Release many leases at once (by id, selector, owner or conversation)",
		Example: `  orchestrator lease reap --selector ci-run=1234 --reason "run cancelled"
  orchestrator lease reap LEASE1 LEASE2
  orchestrator lease reap --all --reason maintenance`,
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.Reap(ctx, &orchv1.ReapRequest{Ids: args, LabelSelector: sel, Owner: owner, ConversationId: conv, All: all, Reason: reason})
			})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&sel, "selector", "", "label selector k=v,k2=v2")
	fs.StringVar(&owner, "owner", "", "owner")
	fs.StringVar(&conv, "conversation", "", "conversation id")
	fs.BoolVar(&all, "all", false, "reap every live lease")
	fs.StringVar(&reason, "reason", "", "reason recorded with the release")
	return cmd
}

// parseState parses --state (READY, released, …); "" is any state.
func parseState(s string) (orchv1.LeaseState, error) {
	if s == "" {
		return orchv1.LeaseState_LEASE_STATE_UNSPECIFIED, nil
	}
	v, ok := orchv1.LeaseState_value["LEASE_STATE_"+strings.ToUpper(s)]
	if !ok {
		return 0, usagef("--state: unknown state %q (want PENDING, READY, RELEASING, RELEASED, EXPIRED or FAILED)", s)
	}
	return orchv1.LeaseState(v), nil
}

// labelFlag collects repeated --label k=v flags.
type labelFlag map[string]string

func (l labelFlag) String() string { return "" }

func (l labelFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", v)
	}
	l[k] = val
	return nil
}

func (l labelFlag) Type() string { return "key=value" }
