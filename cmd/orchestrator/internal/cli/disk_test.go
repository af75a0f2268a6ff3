package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// lease get shows the disk usage against the limit and the warnings.
func TestLeaseTableDisk(t *testing.T) {
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	printTable(&out, &orchv1.Lease{Id: "l1", State: orchv1.LeaseState_LEASE_STATE_READY,
		Resources: &orchv1.Resources{DiskBytes: 20 << 20},
		Usage:     &orchv1.Usage{DiskBytes: 30000000, MeasuredAt: timestamppb.New(at)},
		Warnings:  []string{"disk limit exceeded: 30000000 of 20971520 bytes", "bad \x1b[31m"}})
	got := out.String()
	for _, want := range []string{
		"disk: 30000000 of 20971520 bytes (measured 2026-11-30T12:00:00Z)\n",
		"warning: disk limit exceeded: 30000000 of 20971520 bytes\n",
		`warning: bad \x1b[31m` + "\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table %q lacks %q", got, want)
		}
	}
	out.Reset()
	printTable(&out, &orchv1.Lease{Id: "l2", State: orchv1.LeaseState_LEASE_STATE_READY})
	if strings.Contains(out.String(), "disk:") || strings.Contains(out.String(), "warning:") {
		t.Errorf("a lease without a limit or warnings: %q", out.String())
	}
}
