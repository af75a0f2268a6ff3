package files

import (
	"time"

	"github.com/berth-dev/berth/pkg/agent/files/watch"
	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/errdefs/errgrpc"
	agentv1 "github.com/berth-dev/berth/proto/berth/agent/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Watch streams the changes under a directory: first a ready event, then
// the watch's events as they are reported. A client that reads too slowly
// gets an overflow event instead of the events it could not take. The
// stream ends when the client goes away, the directory goes (after its
// removed event, with OK) or a limit is reached (RESOURCE_EXHAUSTED).
func (s *Server) Watch(req *agentv1.WatchRequest, stream agentv1.FileService_WatchServer) error {
	if ms := req.GetDebounceMs(); time.Duration(ms)*time.Millisecond > watch.MaxDebounce {
		return errgrpc.ToGRPC(errdefs.InvalidArgument("debounce_ms", "must be at most %d, got %d", watch.MaxDebounce.Milliseconds(), ms))
	}
	opts := WatchOptions{Recursive: req.GetRecursive(), Debounce: time.Duration(req.GetDebounceMs()) * time.Millisecond}
	w, err := s.fs.Watch(stream.Context(), req.GetPath(), opts)
	if err != nil {
		return errgrpc.ToGRPC(err)
	}
	defer w.Close()
	for ev := range w.Events() {
		if err := stream.Send(toProtoWatchEvent(ev)); err != nil {
			return err
		}
	}
	return errgrpc.ToGRPC(w.Err())
}

// toProtoWatchEvent converts a watch event for the API (the kinds share
// one order).
func toProtoWatchEvent(ev watch.Event) *agentv1.WatchEvent {
	return &agentv1.WatchEvent{
		Kind:    agentv1.WatchEventKind(ev.Kind),
		Path:    ev.Path,
		OldPath: ev.OldPath,
		IsDir:   ev.IsDir,
		Time:    timestamppb.New(ev.Time),
	}
}
