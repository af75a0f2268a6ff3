package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"sigs.k8s.io/yaml"

	"github.com/berth-dev/berth/internal/quantity"
	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// Output formats of -o.
const (
	outTable = "table"
	outWide  = "wide"
	outJSON  = "json"
	outYAML  = "yaml"
)

// addOutputFlag adds -o/--output to fs. The old parser's long name "o"
// (--o json) stays as a hidden alias.
func addOutputFlag(fs *pflag.FlagSet, p *string) {
	fs.StringVarP(p, "output", "o", outTable, "output format: table, wide, json or yaml")
	fs.StringVar(p, "o", outTable, "output format (alias of --output)")
	_ = fs.MarkHidden("o")
}

// checkOutput validates an -o value.
func checkOutput(format string) error {
	switch format {
	case outTable, outWide, outJSON, outYAML:
		return nil
	}
	return usagef("-o must be table, wide, json or yaml, got %q", format)
}

// printMessage writes msg in format: json is protojson with every field
// (what scripts parse), yaml the same document as YAML, table and wide a
// table for people.
func printMessage(w io.Writer, format string, msg proto.Message) error {
	switch format {
	case outJSON:
		b, err := protojson.MarshalOptions{EmitUnpopulated: true, Indent: "  "}.Marshal(msg)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, string(b))
		return err
	case outYAML:
		return printYAML(w, msg)
	}
	printLeaseTable(w, msg, format == outWide)
	return nil
}

// callPrint dials the orchestrator, runs fn on the client newClient makes,
// with lf's token and a deadline of callTimeout, and prints the answer in
// lf's -o format: json and yaml as printMessage writes them, table and wide
// with table (nil: printMessage's lease table).
func callPrint[C any](ctx context.Context, env Env, lf *leaseFlags, newClient func(grpc.ClientConnInterface) C,
	fn func(context.Context, C) (proto.Message, error), table func(io.Writer, proto.Message)) error {
	conn, err := lf.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	msg, err := fn(withToken(ctx, lf.bearer()), newClient(conn))
	if err != nil {
		return fail(err)
	}
	if table == nil || lf.output == outJSON || lf.output == outYAML {
		return fail(printMessage(env.Stdout, lf.output, msg))
	}
	table(env.Stdout, msg)
	return nil
}

// removeEach is an rm command: it calls rm for each name in turn (callPrint)
// and prints "removed NAME", or with -o json or yaml the message rm
// returns; it stops at the first error.
func removeEach[C any](ctx context.Context, env Env, lf *leaseFlags, newClient func(grpc.ClientConnInterface) C,
	names []string, rm func(ctx context.Context, c C, name string) (proto.Message, error)) error {
	for _, name := range names {
		err := callPrint(ctx, env, lf, newClient, func(ctx context.Context, c C) (proto.Message, error) {
			return rm(ctx, c, name)
		}, func(w io.Writer, _ proto.Message) { fmt.Fprintf(w, "removed %s\n", safe(name)) })
		if err != nil {
			return err
		}
	}
	return nil
}

// printYAML writes msg as a YAML document (protojson field names).
func printYAML(w io.Writer, msg proto.Message) error {
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(msg)
	if err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(b)
	if err != nil {
		return err
	}
	_, err = w.Write(y)
	return err
}

// printStreamed writes one message of a stream (--watch, lease watch):
// json as one line per message, yaml as one document each.
func printStreamed(w io.Writer, format string, msg proto.Message) error {
	if format == outYAML {
		fmt.Fprintln(w, "---")
		return printYAML(w, msg)
	}
	b, err := protojson.Marshal(msg)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// printTable writes msg (a lease, a list, an acquire or reap answer) as the
// default table.
func printTable(w io.Writer, msg proto.Message) { printLeaseTable(w, msg, false) }

func printLeaseTable(w io.Writer, msg proto.Message, wide bool) {
	t := newLeaseTable(wide)
	switch m := msg.(type) {
	case *orchv1.AcquireResponse:
		t.add(m.GetLease())
		t.flush(w)
		fmt.Fprintf(w, "token: %s\n", safe(m.GetToken()))
	case *orchv1.Lease:
		t.add(m)
		t.flush(w)
		if lim := m.GetResources().GetDiskBytes(); lim > 0 && m.GetUsage() != nil {
			fmt.Fprintf(w, "disk: %d of %d bytes (measured %s)\n", m.GetUsage().GetDiskBytes(), lim,
				m.GetUsage().GetMeasuredAt().AsTime().Format(time.RFC3339))
		}
		if u := m.GetUsage(); u.GetSampledAt() != nil { // top.go
			fmt.Fprintln(w, usageLine(u))
		}
		for _, wn := range m.GetWarnings() {
			fmt.Fprintf(w, "warning: %s\n", safe(wn))
		}
	case *orchv1.ListLeasesResponse:
		for _, l := range m.GetLeases() {
			t.add(l)
		}
		t.flush(w)
	case *orchv1.ReapResponse:
		for _, id := range m.GetReaped() {
			fmt.Fprintln(w, safe(id))
		}
	}
}

// table lays out rows in columns two spaces apart. Its widths only grow, so
// rows printed later (--watch) line up with the ones printed first.
type table struct {
	rows   [][]string
	widths []int
	wide   bool
}

func newLeaseTable(wide bool) *table {
	h := []string{"ID", "CONVERSATION", "OWNER", "STATE", "IMAGE", "EXPIRES IN", "REASON"}
	if wide {
		h = []string{"ID", "CONVERSATION", "OWNER", "STATE", "IMAGE", "EXPIRES IN", "USER", "CPUS", "MEMORY", "DISK", "RESTARTS", "AGE", "LABELS", "REASON"}
	}
	t := &table{wide: wide}
	t.addRow(h)
	// The STATE column is as wide as the longest state from the start, so
	// the rows --watch prints as a lease moves on stay aligned.
	t.widths[3] = len("RELEASING")
	return t
}

// add appends a lease's row, every caller-supplied text escaped.
func (t *table) add(l *orchv1.Lease) {
	exp := "-"
	if l.GetExpiresAt() != nil && !stateEnded(l.GetState()) {
		exp = time.Until(l.GetExpiresAt().AsTime()).Round(time.Second).String()
	}
	row := []string{safe(l.GetId()), safe(l.GetConversationId()), safe(l.GetOwner()), stateName(l.GetState()), safe(l.GetImage()), exp}
	if t.wide {
		r := l.GetResources()
		age := "-"
		if l.GetCreatedAt() != nil {
			age = time.Since(l.GetCreatedAt().AsTime()).Round(time.Second).String()
		}
		row = append(row, safe(l.GetUser()), orDash(r.GetCpus() > 0, strconv.FormatFloat(r.GetCpus(), 'f', -1, 64)),
			orDash(r.GetMemoryBytes() > 0, quantity.FormatBytes(r.GetMemoryBytes())), orDash(r.GetDiskBytes() > 0, quantity.FormatBytes(r.GetDiskBytes())),
			strconv.Itoa(int(l.GetRestarts())), age, safe(labelString(l.GetLabels())))
	}
	t.addRow(append(row, safe(l.GetReason())))
}

func (t *table) addRow(row []string) {
	for i, c := range row {
		if i >= len(t.widths) {
			t.widths = append(t.widths, 0)
		}
		t.widths[i] = max(t.widths[i], len([]rune(c)))
	}
	t.rows = append(t.rows, row)
}

// flush writes the rows added since the last flush.
func (t *table) flush(w io.Writer) {
	for _, row := range t.rows {
		var b strings.Builder
		for i, c := range row {
			b.WriteString(c)
			if i < len(row)-1 {
				b.WriteString(strings.Repeat(" ", t.widths[i]-len([]rune(c))+2))
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	t.rows = t.rows[:0]
}

// printList writes items as a table under header, one row each, or
// "no WHAT" under the header when there are none.
func printList[T any](w io.Writer, what string, header []string, items []T, row func(T) []string) {
	t := &table{}
	t.addRow(header)
	for _, it := range items {
		t.addRow(row(it))
	}
	t.flush(w)
	if len(items) == 0 {
		fmt.Fprintln(w, "no "+what)
	}
}

// timeOrDash formats ts as RFC 3339, or "-" when unset.
func timeOrDash(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().Format(time.RFC3339)
}

func orDash(ok bool, s string) string {
	if !ok {
		return "-"
	}
	return s
}

// labelString writes labels as k=v,k2=v2 sorted by key.
func labelString(labels map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return orDash(len(parts) > 0, strings.Join(parts, ","))
}

func stateName(s orchv1.LeaseState) string {
	return strings.TrimPrefix(s.String(), "LEASE_STATE_")
}

func stateEnded(s orchv1.LeaseState) bool {
	switch s {
	case orchv1.LeaseState_LEASE_STATE_RELEASED, orchv1.LeaseState_LEASE_STATE_EXPIRED, orchv1.LeaseState_LEASE_STATE_FAILED:
		return true
	}
	return false
}
