package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Env is what a command needs from its surroundings.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// clientFlags are the flags every client command takes.
type clientFlags struct {
	addr, token, output string
	env                 Env
}

// The token's flag has no default value, so that -h never prints a
// secret: the environment is read in tokenOr, after parsing.
func (c *clientFlags) register(fs *flag.FlagSet, env Env) {
	addr := env.Getenv("BERTH_ADDR")
	if addr == "" {
		addr = DefaultAddr
	}
	fs.StringVar(&c.addr, "addr", addr, "orchestrator address (env BERTH_ADDR)")
	fs.StringVar(&c.token, "token", "", "API token (default: env BERTH_TOKEN, else BERTH_OPERATOR_TOKEN)")
	fs.StringVar(&c.output, "o", "table", "output: table or json")
	c.env = env
}

// bearer returns the token to send: --token, else BERTH_TOKEN, else
// BERTH_OPERATOR_TOKEN.
func (c *clientFlags) bearer() string {
	if c.token != "" || c.env.Getenv == nil {
		return c.token
	}
	if tok := c.env.Getenv("BERTH_TOKEN"); tok != "" {
		return tok
	}
	return c.env.Getenv("BERTH_OPERATOR_TOKEN")
}

// labelFlag collects repeated k=v flags.
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

// RunLease runs `lease SUBCOMMAND ARGS...` and returns the exit code.
func RunLease(ctx context.Context, args []string, env Env) int {
	if len(args) == 0 {
		fmt.Fprintln(env.Stderr, "usage: orchestrator lease acquire|get|list|renew|release|reap|watch [flags]")
		return 2
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("lease "+sub, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	var cf clientFlags
	cf.register(fs, env)

	var pos []string // positional arguments, set once flags are parsed
	oneArg := func() (string, error) {
		if len(pos) != 1 {
			return "", usageError{fmt.Sprintf("want exactly one lease id, got %d arguments", len(pos))}
		}
		return pos[0], nil
	}
	var run func(context.Context, orchv1.LeaseServiceClient) (proto.Message, error)
	switch sub {
	case "acquire":
		conv := fs.String("conversation", "", "conversation id (required)")
		image := fs.String("image", "", "image (default: the orchestrator's default image)")
		ttl := fs.Duration("ttl", 0, "lifetime, e.g. 10m (default: the orchestrator's default)")
		idle := fs.Duration("idle-timeout", 0, "expire after this long without activity")
		cpus := fs.Float64("cpus", 0, "CPU limit")
		mem := fs.Int64("memory", 0, "memory limit in bytes")
		pids := fs.Int64("pids", 0, "process limit")
		owner := fs.String("owner", "", "owner (operator token only)")
		user := fs.String("user", "", "user the sandbox's commands run as: NAME, UID, NAME:GROUP or UID:GID (default: the orchestrator's default user for berth's images, else the image's user)")
		labels := labelFlag{}
		fs.Var(labels, "label", "label key=value (repeatable)")
		run = func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
			req := &orchv1.AcquireRequest{ConversationId: *conv, Image: *image, Labels: labels, Owner: *owner, User: *user,
				Resources: &orchv1.Resources{Cpus: *cpus, MemoryBytes: *mem, Pids: *pids}}
			if *ttl != 0 {
				req.Ttl = durationpb.New(*ttl)
			}
			if *idle != 0 {
				req.IdleTimeout = durationpb.New(*idle)
			}
			return c.Acquire(ctx, req)
		}
	case "get":
		run = func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
			id, err := oneArg()
			if err != nil {
				return nil, err
			}
			return c.Get(ctx, &orchv1.GetLeaseRequest{Id: id})
		}
	case "list":
		state := fs.String("state", "", "filter by state (PENDING, READY, RELEASING, RELEASED, EXPIRED, FAILED)")
		owner := fs.String("owner", "", "filter by owner")
		sel := fs.String("selector", "", "label selector k=v,k2=v2")
		conv := fs.String("conversation", "", "filter by conversation id")
		all := fs.Bool("all", false, "include ended leases")
		run = func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
			st, err := parseState(*state)
			if err != nil {
				return nil, err
			}
			out := &orchv1.ListLeasesResponse{}
			req := &orchv1.ListLeasesRequest{State: st, Owner: *owner, LabelSelector: *sel, ConversationId: *conv, IncludeEnded: *all, PageSize: 1000}
			for {
				page, err := c.List(ctx, req)
				if err != nil {
					return nil, err
				}
				out.Leases = append(out.Leases, page.Leases...)
				if page.NextPageToken == "" {
					return out, nil
				}
				req.PageToken = page.NextPageToken
			}
		}
	case "renew":
		ttl := fs.Duration("ttl", 0, "new lifetime from now (default: the lease's ttl)")
		run = func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
			id, err := oneArg()
			if err != nil {
				return nil, err
			}
			req := &orchv1.RenewRequest{Id: id}
			if *ttl != 0 {
				req.Ttl = durationpb.New(*ttl)
			}
			return c.Renew(ctx, req)
		}
	case "release":
		reason := fs.String("reason", "", "reason recorded with the release")
		run = func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
			id, err := oneArg()
			if err != nil {
				return nil, err
			}
			return c.Release(ctx, &orchv1.ReleaseRequest{Id: id, Reason: *reason})
		}
	case "reap":
		sel := fs.String("selector", "", "label selector k=v,k2=v2")
		owner := fs.String("owner", "", "owner")
		conv := fs.String("conversation", "", "conversation id")
		all := fs.Bool("all", false, "reap every live lease")
		reason := fs.String("reason", "", "reason recorded with the release")
		run = func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
			return c.Reap(ctx, &orchv1.ReapRequest{Ids: pos, LabelSelector: *sel, Owner: *owner, ConversationId: *conv, All: *all, Reason: *reason})
		}
	case "watch":
		owner := fs.String("owner", "", "only this owner's leases")
		lease := fs.String("lease", "", "only this lease")
		if _, _, err := parseArgs(fs, args); err != nil {
			return 2
		}
		return watch(ctx, cf, &orchv1.WatchRequest{Owner: *owner, LeaseId: *lease}, env)
	default:
		fmt.Fprintf(env.Stderr, "orchestrator lease: unknown command %q\n", sub)
		return 2
	}
	var err error
	if pos, _, err = parseArgs(fs, args); err != nil {
		return 2
	}
	if cf.output != "table" && cf.output != "json" {
		fmt.Fprintf(env.Stderr, "orchestrator: -o must be table or json, got %q\n", cf.output)
		return 2
	}
	conn, err := dial(cf.addr)
	if err != nil {
		fmt.Fprintln(env.Stderr, "orchestrator:", err)
		return 2
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	msg, err := run(withToken(ctx, cf.bearer()), orchv1.NewLeaseServiceClient(conn))
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(env.Stderr, "orchestrator lease %s: %s\n", sub, ue.msg)
			return 2
		}
		return fail(env, err)
	}
	if cf.output == "json" {
		b, _ := protojson.MarshalOptions{EmitUnpopulated: true, Indent: "  "}.Marshal(msg)
		fmt.Fprintln(env.Stdout, string(b))
		return 0
	}
	printTable(env.Stdout, msg)
	return 0
}

func watch(ctx context.Context, cf clientFlags, req *orchv1.WatchRequest, env Env) int {
	conn, err := dial(cf.addr)
	if err != nil {
		fmt.Fprintln(env.Stderr, "orchestrator:", err)
		return 2
	}
	defer conn.Close()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	stream, err := orchv1.NewLeaseServiceClient(conn).Watch(withToken(ctx, cf.bearer()), req)
	if err != nil {
		return fail(env, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return 0
			}
			return fail(env, err)
		}
		if cf.output == "json" {
			b, _ := protojson.Marshal(ev)
			fmt.Fprintln(env.Stdout, string(b))
			continue
		}
		tr := ev.GetTransition()
		fmt.Fprintf(env.Stdout, "%s\t%s\t%s -> %s\t%s\n", tr.GetAt().AsTime().Format(time.RFC3339), safe(ev.GetLease().GetId()),
			stateName(tr.GetFrom()), stateName(tr.GetTo()), safe(tr.GetReason()))
	}
}

// fail prints a one-line error (the message, escaped, then the gRPC code)
// and returns 1.
func fail(env Env, err error) int {
	st := status.Convert(err)
	msg := safe(strings.ReplaceAll(st.Message(), "\n", " "))
	fmt.Fprintf(env.Stderr, "orchestrator: %s (%s)\n", msg, st.Code())
	return 1
}

// usageError is a mistake in the command line (exit code 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// parseArgs parses flags anywhere among the arguments (so "get ID -o json"
// works) and returns the positional arguments; everything after "--" is
// returned separately and untouched.
func parseArgs(fs *flag.FlagSet, args []string) (pos, rest []string, err error) {
	head := args
	for i, a := range args {
		if a == "--" {
			head, rest = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(head); err != nil {
			return nil, nil, err
		}
		head = fs.Args()
		if len(head) == 0 {
			return pos, rest, nil
		}
		pos = append(pos, head[0])
		head = head[1:]
	}
}

func parseState(s string) (orchv1.LeaseState, error) {
	if s == "" {
		return orchv1.LeaseState_LEASE_STATE_UNSPECIFIED, nil
	}
	v, ok := orchv1.LeaseState_value["LEASE_STATE_"+strings.ToUpper(s)]
	if !ok {
		return 0, fmt.Errorf("--state: unknown state %q", s)
	}
	return orchv1.LeaseState(v), nil
}

func stateName(s orchv1.LeaseState) string {
	return strings.TrimPrefix(s.String(), "LEASE_STATE_")
}

func printTable(w io.Writer, msg proto.Message) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	row := func(l *orchv1.Lease) {
		exp := "-"
		if l.GetExpiresAt() != nil && !stateEnded(l.GetState()) {
			exp = time.Until(l.GetExpiresAt().AsTime()).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", safe(l.GetId()), safe(l.GetConversationId()), safe(l.GetOwner()), stateName(l.GetState()),
			safe(l.GetImage()), exp, safe(l.GetReason()))
	}
	header := func() { fmt.Fprintln(tw, "ID\tCONVERSATION\tOWNER\tSTATE\tIMAGE\tEXPIRES IN\tREASON") }
	switch m := msg.(type) {
	case *orchv1.AcquireResponse:
		header()
		row(m.GetLease())
		tw.Flush()
		fmt.Fprintf(w, "token: %s\n", safe(m.GetToken()))
	case *orchv1.Lease:
		header()
		row(m)
		tw.Flush()
		if lim := m.GetResources().GetDiskBytes(); lim > 0 && m.GetUsage() != nil {
			fmt.Fprintf(w, "disk: %d of %d bytes (measured %s)\n", m.GetUsage().GetDiskBytes(), lim,
				m.GetUsage().GetMeasuredAt().AsTime().Format(time.RFC3339))
		}
		for _, wn := range m.GetWarnings() {
			fmt.Fprintf(w, "warning: %s\n", safe(wn))
		}
	case *orchv1.ListLeasesResponse:
		header()
		for _, l := range m.Leases {
			row(l)
		}
	case *orchv1.ReapResponse:
		for _, id := range m.GetReaped() {
			fmt.Fprintln(tw, safe(id))
		}
	}
}

func stateEnded(s orchv1.LeaseState) bool {
	switch s {
	case orchv1.LeaseState_LEASE_STATE_RELEASED, orchv1.LeaseState_LEASE_STATE_EXPIRED, orchv1.LeaseState_LEASE_STATE_FAILED:
		return true
	}
	return false
}
