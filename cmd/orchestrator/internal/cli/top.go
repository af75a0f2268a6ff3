package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth/internal/quantity"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// topParallel bounds the concurrent Get calls of one refresh.
const topParallel = 8

// newTopCommand is `orchestrator lease top`.
func newTopCommand(env Env, lf *leaseFlags) *cobra.Command {
	var (
		interval time.Duration
		once     bool
		owner    string
	)
	cmd := &cobra.Command{
		Use:   "top [--interval D] [--once]",
		Short: "Show the live leases' CPU, memory, disk, network and processes, refreshed like docker stats",
		Long: `Show one row per READY or PAUSED lease the token can see, with its sandbox's
CPU use (percent of one CPU over the refresh interval), memory (in use / limit,
and peak), disk (last measured), network bytes received and sent, and
processes. On a terminal the table is redrawn every --interval (default 2s)
until interrupted (exit 0); --once, a pipe or -o json/yaml print one snapshot
(json: a ListLeasesResponse whose leases carry usage). The first CPU figure
of a lease appears at the second refresh (it needs two samples). It lists
leases, so it needs the operator's or a client's token; with a lease token
use lease get.`,
		Example: `  orchestrator lease top
  orchestrator lease top --once
  orchestrator lease top -o json | jq '.leases[] | {id, mem: .usage.memoryBytes}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return usagef("--interval must be positive")
			}
			conn, ctx, done, err := lf.dialInterruptible(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			c := orchv1.NewLeaseServiceClient(conn)
			snapshot := func() (*orchv1.ListLeasesResponse, error) {
				cctx, cancel := context.WithTimeout(withToken(ctx, lf.bearer()), time.Minute)
				defer cancel()
				return topSnapshot(cctx, c, owner)
			}
			structured := lf.output == outJSON || lf.output == outYAML
			live := !once && !structured && terminalFD(env.Stdout) >= 0
			for {
				snap, err := snapshot()
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fail(err)
				}
				if structured {
					return fail(printMessage(env.Stdout, lf.output, snap))
				}
				if live {
					fmt.Fprint(env.Stdout, "\x1b[H\x1b[2J") // home, clear
				}
				printTop(env.Stdout, snap.GetLeases())
				if !live {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	fs := cmd.Flags()
	fs.DurationVar(&interval, "interval", 2*time.Second, "time between refreshes")
	fs.BoolVar(&once, "once", false, "print one snapshot and exit")
	fs.StringVar(&owner, "owner", "", "only this owner's leases")
	return cmd
}

// topSnapshot lists the READY and PAUSED leases and gets each (Get fills
// the live usage), topParallel at a time.
func topSnapshot(ctx context.Context, c orchv1.LeaseServiceClient, owner string) (*orchv1.ListLeasesResponse, error) {
	var leases []*orchv1.Lease
	for _, st := range []orchv1.LeaseState{orchv1.LeaseState_LEASE_STATE_READY, orchv1.LeaseState_LEASE_STATE_PAUSED} {
		ls, err := listAll(ctx, c, &orchv1.ListLeasesRequest{State: st, Owner: owner, PageSize: 1000})
		if err != nil {
			return nil, err
		}
		leases = append(leases, ls...)
	}
	out := make([]*orchv1.Lease, len(leases))
	sem := make(chan struct{}, topParallel)
	var wg sync.WaitGroup
	for i, l := range leases {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if got, err := c.Get(ctx, &orchv1.GetLeaseRequest{Id: l.GetId()}); err == nil {
				out[i] = got
			} else {
				out[i] = l // ended or vanished since the list: show what the list had
			}
		}()
	}
	wg.Wait()
	return &orchv1.ListLeasesResponse{Leases: out}, nil
}

// printTop writes the usage table.
func printTop(w io.Writer, leases []*orchv1.Lease) {
	t := &table{}
	t.addRow([]string{"LEASE", "CONVERSATION", "STATE", "CPU %", "MEM USAGE / LIMIT", "MEM %", "MEM PEAK", "DISK", "NET RX / TX", "PIDS"})
	for _, l := range leases {
		u := l.GetUsage()
		row := []string{safe(l.GetId()), safe(l.GetConversationId()), stateName(l.GetState())}
		if u.GetSampledAt() == nil {
			row = append(row, "-", "-", "-", "-", orDash(u.GetMeasuredAt() != nil, quantity.FormatBytes(u.GetDiskBytes())), "-", "-")
			t.addRow(row)
			continue
		}
		limit := u.GetMemoryLimitBytes()
		memPct := "-"
		if limit > 0 {
			memPct = strconv.FormatFloat(float64(u.GetMemoryBytes())/float64(limit)*100, 'f', 2, 64) + "%"
		}
		row = append(row,
			strconv.FormatFloat(u.GetCpuPercent(), 'f', 2, 64)+"%",
			quantity.FormatBytes(u.GetMemoryBytes())+" / "+orDash(limit > 0, quantity.FormatBytes(limit)),
			memPct,
			orDash(u.GetMemoryPeakBytes() > 0, quantity.FormatBytes(u.GetMemoryPeakBytes())),
			orDash(u.GetMeasuredAt() != nil, quantity.FormatBytes(u.GetDiskBytes())),
			quantity.FormatBytes(u.GetNetworkRxBytes())+" / "+quantity.FormatBytes(u.GetNetworkTxBytes()),
			strconv.FormatInt(u.GetProcesses(), 10))
		t.addRow(row)
	}
	t.flush(w)
}

// usageLine is the one-line usage summary `lease get` prints under its row.
func usageLine(u *orchv1.Usage) string {
	mem := quantity.FormatBytes(u.GetMemoryBytes())
	if p := u.GetMemoryPeakBytes(); p > 0 {
		mem += " (peak " + quantity.FormatBytes(p) + ")"
	}
	if l := u.GetMemoryLimitBytes(); l > 0 {
		mem += " of " + quantity.FormatBytes(l)
	}
	return fmt.Sprintf("usage: cpu %s (%.1f%%), memory %s, network %s in / %s out, %d processes",
		(time.Duration(u.GetCpuNanos()) * time.Nanosecond).Round(time.Millisecond), u.GetCpuPercent(), mem,
		quantity.FormatBytes(u.GetNetworkRxBytes()), quantity.FormatBytes(u.GetNetworkTxBytes()), u.GetProcesses())
}
