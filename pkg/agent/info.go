package agent

import (
	"context"
	"os"
	goruntime "runtime"
	"time"

	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// infoServer implements InfoService.
type infoServer struct {
	agentv1.UnimplementedInfoServiceServer
	version   string
	started   time.Time
	workDir   string
	gitExists func() bool
}

func (s *infoServer) GetInfo(context.Context, *agentv1.GetInfoRequest) (*agentv1.Info, error) {
	host, _ := os.Hostname()
	return &agentv1.Info{
		Version:      s.version,
		Uptime:       durationpb.New(time.Since(s.started)),
		StartedAt:    timestamppb.New(s.started),
		WorkspaceDir: s.workDir,
		Hostname:     host,
		Pid:          int32(os.Getpid()),
		GitAvailable: s.gitExists(),
		Os:           goruntime.GOOS,
		Arch:         goruntime.GOARCH,
	}, nil
}
