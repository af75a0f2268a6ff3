package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/berth-dev/berth/internal/quantity"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// newVolumeCommand is `orchestrator volume`: list, inspect and remove the
// workspace volumes that `lease acquire --persist` creates.
func newVolumeCommand(env Env) *cobra.Command {
	lf := &leaseFlags{}
	cmd := newGroup("volume", "List, inspect and remove persistent workspace volumes (lease acquire --persist)",
		`  orchestrator lease acquire --conversation c-1 --persist
  orchestrator volume list -o json
  orchestrator volume inspect berth-ws-0123456789abcdef0123456789abcdef
  orchestrator volume rm berth-ws-0123456789abcdef0123456789abcdef`,
		newVolumeListCommand(env, lf), newVolumeInspectCommand(env, lf), newVolumeRmCommand(env, lf))
	return lf.registerGroup(cmd, env)
}

func newVolumeListCommand(env Env, lf *leaseFlags) *cobra.Command {
	var owner, conv string
	cmd := &cobra.Command{
		Use:     "list [--owner O] [--conversation ID]",
		Aliases: []string{"ls"},
		Short:   "List workspace volumes (a client sees its own; the operator every owner's)",
		Example: `  orchestrator volume list
  orchestrator volume list --conversation c-1 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lf.callVolumes(cmd.Context(), env, func(ctx context.Context, c orchv1.VolumeServiceClient) (proto.Message, error) {
				return c.List(ctx, &orchv1.ListVolumesRequest{Owner: owner, ConversationId: conv})
			})
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "one owner's volumes (operator)")
	cmd.Flags().StringVar(&conv, "conversation", "", "the volume of one conversation")
	return cmd
}

func newVolumeInspectCommand(env Env, lf *leaseFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "inspect NAME",
		Aliases: []string{"get"},
		Short:   "Show one volume with its size measured",
		Example: `  orchestrator volume inspect berth-ws-0123456789abcdef0123456789abcdef -o json | jq .sizeBytes`,
		Args:    exactArgs(1, "one volume name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return lf.callVolumes(cmd.Context(), env, func(ctx context.Context, c orchv1.VolumeServiceClient) (proto.Message, error) {
				return c.Get(ctx, &orchv1.GetVolumeRequest{Name: args[0]})
			})
		},
	}
}

func newVolumeRmCommand(env Env, lf *leaseFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove"},
		Short:   "Remove volumes and their files (refused while a lease uses one)",
		Example: `  orchestrator volume rm berth-ws-0123456789abcdef0123456789abcdef`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return removeEach(cmd.Context(), env, lf, orchv1.NewVolumeServiceClient, args, func(ctx context.Context, c orchv1.VolumeServiceClient, name string) (proto.Message, error) {
				_, err := c.Delete(ctx, &orchv1.DeleteVolumeRequest{Name: name})
				return &orchv1.Volume{Name: name}, err
			})
		},
	}
}

// callVolumes is leaseFlags.call on the VolumeService, with the volume
// table for -o table and wide.
func (lf *leaseFlags) callVolumes(ctx context.Context, env Env, fn func(context.Context, orchv1.VolumeServiceClient) (proto.Message, error)) error {
	return callPrint(ctx, env, lf, orchv1.NewVolumeServiceClient, fn, printVolumes)
}

// printVolumes writes volumes as a table.
func printVolumes(w io.Writer, msg proto.Message) {
	var list []*orchv1.Volume
	switch m := msg.(type) {
	case *orchv1.Volume:
		list = []*orchv1.Volume{m}
	case *orchv1.ListVolumesResponse:
		list = m.GetVolumes()
	}
	header := []string{"NAME", "SIZE", "OWNER", "CONVERSATION", "IN USE BY", "LAST USED", "CREATED"}
	printList(w, "volumes", header, list, func(v *orchv1.Volume) []string {
		return []string{safe(v.GetName()), orDash(v.GetSizeBytes() >= 0, quantity.FormatBytes(v.GetSizeBytes())), orDash(v.GetOwner() != "", safe(v.GetOwner())),
			orDash(v.GetConversationId() != "", safe(v.GetConversationId())), orDash(v.GetInUse(), safe(v.GetLeaseId())),
			timeOrDash(v.GetLastUsedAt()), timeOrDash(v.GetCreatedAt())}
	})
}

// mountFlag collects --mount HOST_PATH:TARGET[:ro|:rw] (repeatable).
type mountFlag struct{ mounts []*orchv1.HostMount }

// String implements pflag.Value.
func (f *mountFlag) String() string {
	parts := make([]string, len(f.mounts))
	for i, m := range f.mounts {
		parts[i] = m.HostPath + ":" + m.Target
		if m.ReadOnly {
			parts[i] += ":ro"
		}
	}
	return strings.Join(parts, ",")
}

// Set implements pflag.Value.
func (f *mountFlag) Set(s string) error {
	p := strings.Split(s, ":")
	m := &orchv1.HostMount{}
	switch {
	case len(p) == 2:
	case len(p) == 3 && (p[2] == "ro" || p[2] == "rw"):
		m.ReadOnly = p[2] == "ro"
	default:
		return fmt.Errorf("--mount %q: want HOST_PATH:TARGET, HOST_PATH:TARGET:ro or HOST_PATH:TARGET:rw", s)
	}
	if p[0] == "" || p[1] == "" {
		return fmt.Errorf("--mount %q: want HOST_PATH:TARGET", s)
	}
	m.HostPath, m.Target = p[0], p[1]
	f.mounts = append(f.mounts, m)
	return nil
}

// Type implements pflag.Value.
func (f *mountFlag) Type() string { return "HOST:TARGET[:ro]" }
