package containerd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/pkg/cio"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
	"github.com/berth-dev/berth/pkg/runtime/containerd/shimlog"
)

var _ runtime.LogStreamer = (*Runtime)(nil)

// logPoll is how often a followed log file is checked for new output.
const logPoll = 250 * time.Millisecond

// taskIO is the output of sandbox id's task: berth's logging binary (the
// sandbox's copy of sandbox-agent, run by the task's shim; package shimlog)
// writes stdout and stderr to StateDir/sandboxes/ID/log, rotated at
// Config.Output's bound (log.1 …).
func (r *Runtime) taskIO(id string) cio.Creator {
	o := r.cfg.Output.WithDefaults()
	bin := filepath.Join(r.sandboxDir(id), "berth", runtime.AgentFile)
	return cio.BinaryIO(bin, map[string]string{shimlog.Arg: shimlog.Encode(r.logPath(id), o.MaxBytes, o.MaxFiles)})
}

// StreamLogs reads the sandbox's output from the file its task's logging
// binary writes stdout and stderr to (taskIO; the two streams are not
// told apart, so every line is runtime.LogOutput, and the file has no
// times, so LogOptions.Since is ignored; Tail reads the current file
// only). With Follow it polls the file until ctx ends or the task stops,
// and goes on in the new file when the log was rotated.
func (r *Runtime) StreamLogs(ctx context.Context, id string, opts runtime.LogOptions, fn func(runtime.LogLine) error) error {
	if id == "" {
		return errdefs.InvalidArgument("id", "container id is required")
	}
	nsctx := r.withNS(ctx)
	if _, err := r.getManaged(nsctx, id); err != nil {
		if errdefs.IsNotFound(err) {
			if ok, rerr := r.lastWords.Replay(id, opts, fn); ok {
				return rerr
			}
		}
		return err
	}
	f, err := os.Open(r.logPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		// Being removed (the file goes before the container): its last
		// words were kept before the removal began.
		if ok, rerr := r.lastWords.Replay(id, opts, fn); ok {
			return rerr
		}
		if !opts.Follow {
			return nil
		}
	} else if err != nil {
		return err
	}
	if f != nil {
		defer f.Close()
	}
	if f != nil && opts.Tail > 0 {
		if err := seekTail(f, opts.Tail); err != nil {
			return err
		}
	}
	var pending []byte
	emit := func(b []byte) error {
		for {
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				pending = append(pending, b...)
				if len(pending) > runtime.MaxLogLine {
					line := pending
					pending = nil
					return fn(runtime.LogLine{Stream: runtime.LogOutput, Text: string(bytes.ToValidUTF8(line, []byte("?")))})
				}
				return nil
			}
			line := append(pending, b[:i]...)
			pending = nil
			b = b[i+1:]
			if err := fn(runtime.LogLine{Stream: runtime.LogOutput, Text: string(bytes.ToValidUTF8(line, []byte("?")))}); err != nil {
				return err
			}
		}
	}
	buf := make([]byte, 32<<10)
	lastCheck := time.Now()
	for {
		if f == nil {
			if f, err = os.Open(r.logPath(id)); err == nil {
				defer f.Close()
			}
		}
		n := 0
		if f != nil {
			n, err = f.Read(buf)
			if n > 0 {
				if ferr := emit(buf[:n]); ferr != nil {
					return ferr
				}
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return err
			}
		}
		if n > 0 {
			continue
		}
		if !opts.Follow {
			break
		}
		if f != nil && rotated(f, r.logPath(id)) {
			// At the end of a file moved to log.1: what follows is in
			// the new one, from its start.
			f.Close()
			f = nil
			continue
		}
		// At the end of the file: stop when the task did, else wait.
		if time.Since(lastCheck) >= time.Second {
			lastCheck = time.Now()
			proc, err := r.taskProcess(nsctx, id)
			if err != nil || proc == nil || proc.GetStatus() == tasktypes.Status_STOPPED {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(logPoll):
		}
	}
	if len(pending) > 0 {
		return fn(runtime.LogLine{Stream: runtime.LogOutput, Text: string(bytes.ToValidUTF8(pending, []byte("?")))})
	}
	return nil
}

// rotated reports whether path is no longer the file f (the log was
// rotated, or removed).
func rotated(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && (err2 != nil || !os.SameFile(a, b))
}

// seekTail positions f at the start of its last n lines (looking back at
// most 4 MiB).
func seekTail(f *os.File, n int) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	const window = 4 << 20
	start := max(st.Size()-window, 0)
	if _, err := f.Seek(start, io.SeekStart); err != nil {
		return err
	}
	var offs []int64 // offsets of line starts
	pos := start
	sc := bufio.NewReader(f)
	if start > 0 { // skip the partial first line
		b, err := sc.ReadBytes('\n')
		pos += int64(len(b))
		if err != nil {
			_, err = f.Seek(st.Size(), io.SeekStart)
			return err
		}
	}
	for {
		b, err := sc.ReadBytes('\n')
		if len(b) > 0 {
			offs = append(offs, pos)
			pos += int64(len(b))
		}
		if err != nil {
			break
		}
	}
	at := st.Size()
	if len(offs) > 0 {
		at = offs[max(len(offs)-n, 0)]
	}
	_, err = f.Seek(at, io.SeekStart)
	return err
}

// keepLastWords stores the last lines of the output of sandbox id, when
// its task is not running, before it is removed (runtime.LastWords), so
// that its lease's log can still show them.
func (r *Runtime) keepLastWords(ctx context.Context, id string) {
	if proc, err := r.taskProcess(ctx, id); err != nil || (proc != nil && proc.GetStatus() == tasktypes.Status_RUNNING) {
		return
	}
	r.lastWords.Collect(ctx, r, id)
}
