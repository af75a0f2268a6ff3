package cli

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	orchv1 "github.com/berth-dev/berth/proto/berth/orchestrator/v1"
)

// fakeVolumes answers the volume calls the CLI makes.
type fakeVolumes struct {
	orchv1.UnimplementedVolumeServiceServer
}

// fakeSnapshots answers the snapshot calls the CLI makes.
type fakeSnapshots struct {
	orchv1.UnimplementedLeaseServiceServer
}

func (fakeVolumes) List(context.Context, *orchv1.ListVolumesRequest) (*orchv1.ListVolumesResponse, error) {
	return &orchv1.ListVolumesResponse{Volumes: []*orchv1.Volume{{Name: "berth-ws-1", Owner: "o", SizeBytes: -1}}}, nil
}

func (fakeVolumes) Delete(context.Context, *orchv1.DeleteVolumeRequest) (*orchv1.DeleteVolumeResponse, error) {
	return &orchv1.DeleteVolumeResponse{}, nil
}

func (fakeSnapshots) ListSnapshots(context.Context, *orchv1.ListSnapshotsRequest) (*orchv1.ListSnapshotsResponse, error) {
	return &orchv1.ListSnapshotsResponse{}, nil
}

func (fakeSnapshots) DeleteSnapshot(_ context.Context, req *orchv1.DeleteSnapshotRequest) (*orchv1.DeleteSnapshotResponse, error) {
	if req.GetName() == "missing" {
		return nil, status.Error(codes.NotFound, "snapshot missing not found")
	}
	return &orchv1.DeleteSnapshotResponse{}, nil
}

// TestCallPrint runs the volume and snapshot commands against a fake
// server: tables for people, "removed NAME" for rm, protojson for -o json.
func TestCallPrint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	orchv1.RegisterVolumeServiceServer(srv, fakeVolumes{})
	orchv1.RegisterLeaseServiceServer(srv, fakeSnapshots{})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	env := func(out *bytes.Buffer) Env {
		return Env{Stdout: out, Stderr: &bytes.Buffer{}, Getenv: func(k string) string {
			if k == "BERTH_ADDR" {
				return "http://" + ln.Addr().String()
			}
			return ""
		}}
	}
	for _, tc := range []struct {
		args []string
		want []string
		code int
	}{
		{[]string{"volume", "list"}, []string{"NAME        SIZE  OWNER", "berth-ws-1  -     o"}, 0},
		{[]string{"volume", "list", "-o", "json"}, []string{`"name":"berth-ws-1"`, `"sizeBytes":"-1"`}, 0},
		{[]string{"volume", "rm", "berth-ws-1"}, []string{"removed berth-ws-1\n"}, 0},
		{[]string{"volume", "rm", "berth-ws-1", "-o", "json"}, []string{`"name":"berth-ws-1"`, `"inUse":false`}, 0},
		{[]string{"snapshot", "list"}, []string{"NAME  SIZE  LEASE", "no snapshots"}, 0},
		{[]string{"snapshot", "rm", "s1", "s2"}, []string{"removed s1\nremoved s2\n"}, 0},
		{[]string{"snapshot", "rm", "s1", "-o", "yaml"}, []string{"name: s1", "ref: \"\""}, 0},
		// rm stops at the first failure.
		{[]string{"snapshot", "rm", "s1", "missing", "s2"}, []string{"removed s1\n"}, 1},
	} {
		var out bytes.Buffer
		if code := Run(context.Background(), tc.args, env(&out)); code != tc.code {
			t.Errorf("%v: exit %d, want %d", tc.args, code, tc.code)
		}
		got := out.String()
		if slices.Contains(tc.args, "missing") && strings.Contains(got, "s2") {
			t.Errorf("%v: went on after a failure: %q", tc.args, got)
		}
		if slices.Contains(tc.args, "json") { // protojson varies its spaces
			got = strings.Join(strings.Fields(got), "")
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%v: output %q lacks %q", tc.args, got, w)
			}
		}
	}
}
