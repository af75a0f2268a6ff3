package cli

import (
	"context"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// networkFlags are the network policy flags of `lease network` and
// `lease acquire`.
type networkFlags struct {
	mode        string
	allow, deny []string
}

// register adds --NAMEmode, --allow and --deny (name is "" or "network-").
func (n *networkFlags) register(fs *pflag.FlagSet, modeFlag string) {
	fs.StringVar(&n.mode, modeFlag, "", "network mode: none (nothing but the agent's port), restricted (only --allow) or open (everything but --deny)")
	fs.StringSliceVar(&n.allow, "allow", nil, "what restricted mode lets through: CIDR, HOST:PORT, name or *.suffix (repeatable, comma-separated)")
	fs.StringSliceVar(&n.deny, "deny", nil, "what is refused in every mode, same forms; wins over --allow (repeatable, comma-separated)")
}

// set reports whether any network flag was given.
func (n *networkFlags) set() bool { return n.mode != "" || len(n.allow) > 0 || len(n.deny) > 0 }

func (n *networkFlags) policy() *orchv1.NetworkPolicy {
	return &orchv1.NetworkPolicy{Mode: n.mode, Allow: n.allow, Deny: n.deny}
}

// newLeaseNetworkCommand is `orchestrator lease network`.
func newLeaseNetworkCommand(env Env, lf *leaseFlags) *cobra.Command {
	var nf networkFlags
	cmd := &cobra.Command{
		Use:   "network LEASE [--mode none|restricted|open] [--allow X]... [--deny X]...",
		Short: "Replace a running lease's network policy",
		Long: `Replace the network policy of a live lease: what its sandbox may reach.
The new policy replaces the whole old one (give every --allow and --deny you
want to keep) and applies to the sandbox's new connections at once;
connections already open stay open. It is kept with the lease, across
restarts of the sandbox and of the orchestrator. --mode left out takes the
orchestrator's default mode.

Modes: none (nothing; the orchestrator still reaches the agent), restricted
(only --allow), open (everything but --deny). Entries: a CIDR (10.0.0.0/8),
an address, HOST:PORT (10.0.0.5:443, api.example.com:443), a domain name
(example.com) or *.example.com (every name under it). Names resolve through
berth's resolver, which answers only allowed names and opens exactly the
addresses it answered. Metadata services, link-local addresses, the host and
other sandboxes are always denied. Needs the owner's or the operator's
token: a lease token cannot change its own policy. See docs/network-policy.md.`,
		Example: `  orchestrator lease network LEASE --mode restricted --allow example.com --allow '*.pypi.org:443'
  orchestrator lease network LEASE --mode open --deny 10.0.0.0/8 --deny tracker.example.com
  orchestrator lease network LEASE --mode none -o json`,
		Args:              exactArgs(1, "one lease id"),
		ValidArgsFunction: completeLeaseIDs(lf),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !nf.set() {
				return usagef("give --mode, --allow or --deny")
			}
			return lf.call(cmd.Context(), env, func(ctx context.Context, c orchv1.LeaseServiceClient) (proto.Message, error) {
				return c.SetNetwork(ctx, &orchv1.SetNetworkRequest{Id: args[0], Network: nf.policy()})
			})
		},
	}
	nf.register(cmd.Flags(), "mode")
	return cmd
}
