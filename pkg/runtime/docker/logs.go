package docker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

var _ runtime.LogStreamer = (*Runtime)(nil)

// StreamLogs reads the container's stdout and stderr from the engine's
// logs API (with timestamps), line by line. The stream ends when the
// output does, or with Follow when the container stops or ctx ends.
func (r *Runtime) StreamLogs(ctx context.Context, id string, opts runtime.LogOptions, fn func(runtime.LogLine) error) error {
	r.negotiate(ctx)
	if id == "" {
		return errdefs.InvalidArgument("id", "container id is required")
	}
	if _, err := r.inspectManaged(ctx, id); err != nil {
		if errdefs.IsNotFound(err) {
			if ok, rerr := r.lastWords.Replay(id, opts, fn); ok {
				return rerr
			}
		}
		return err
	}
	lo := container.LogsOptions{ShowStdout: true, ShowStderr: true, Timestamps: true, Follow: opts.Follow}
	if opts.Tail > 0 {
		lo.Tail = strconv.Itoa(opts.Tail)
	}
	if !opts.Since.IsZero() {
		lo.Since = fmt.Sprintf("%d.%09d", opts.Since.Unix(), opts.Since.Nanosecond())
	}
	rc, err := r.cli.ContainerLogs(ctx, id, lo)
	if err != nil {
		// Being removed ("dead or marked for removal"): its last words
		// were kept before the removal began.
		if ok, rerr := r.lastWords.Replay(id, opts, fn); ok {
			return rerr
		}
		return r.mapErr(err, "container logs", id)
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.Close() })
	defer stop()
	// The engine multiplexes both streams; each line carries its time.
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(outW, errW, rc)
		outW.CloseWithError(err)
		errW.CloseWithError(err)
		done <- err
	}()
	lines := make(chan runtime.LogLine)
	scanDone := make(chan struct{}, 2)
	scan := func(rd *io.PipeReader, stream string) {
		defer func() { scanDone <- struct{}{} }()
		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 4096), runtime.MaxLogLine)
		for sc.Scan() {
			select {
			case lines <- parseTimestamped(sc.Text(), stream):
			case <-ctx.Done():
				rd.CloseWithError(ctx.Err())
				return
			}
		}
		// A line past runtime.MaxLogLine ends the scanner: drain the rest.
		_, _ = io.Copy(io.Discard, rd)
	}
	go scan(outR, runtime.LogStdout)
	go scan(errR, runtime.LogStderr)
	go func() {
		<-scanDone
		<-scanDone
		close(lines)
	}()
	var fnErr error
	for l := range lines {
		if fnErr == nil {
			if fnErr = fn(l); fnErr != nil {
				rc.Close()
				outR.CloseWithError(fnErr)
				errR.CloseWithError(fnErr)
			}
		}
	}
	copyErr := <-done
	switch {
	case fnErr != nil:
		return fnErr
	case ctx.Err() != nil:
		return nil
	case copyErr != nil && !errors.Is(copyErr, io.EOF) && !errors.Is(copyErr, io.ErrClosedPipe):
		return r.mapErr(copyErr, "container logs", id)
	}
	return nil
}

// parseTimestamped splits the engine's "RFC3339NANO text" line.
func parseTimestamped(line, stream string) runtime.LogLine {
	l := runtime.LogLine{Stream: stream, Text: line}
	if ts, rest, ok := strings.Cut(line, " "); ok {
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			l.Time, l.Text = t, rest
		}
	}
	return l
}

// keepLastWords stores the last lines of an exited container's output
// before it is removed (runtime.LastWords), so that its lease's log can
// still show them. It is bounded by a short timeout: a removal does not
// wait long for it.
func (r *Runtime) keepLastWords(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	r.lastWords.Collect(ctx, r, id)
}
