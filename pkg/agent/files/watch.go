package files

import (
	"context"
	"strings"
	"time"

	"github.com/berth-dev/berth/pkg/agent/files/watch"
	"github.com/berth-dev/berth/pkg/errdefs"
)

// Defaults of the watch limits of Config.
const (
	// DefaultMaxWatches is the default of Config.MaxWatches.
	DefaultMaxWatches = 16
	// DefaultMaxWatchDirs is the default of Config.MaxWatchDirs.
	DefaultMaxWatchDirs = 16384
)

// WatchOptions configures FS.Watch.
type WatchOptions struct {
	// Recursive watches every directory below the path too.
	Recursive bool
	// Debounce is the quiet time after which a burst of changes is
	// reported; 0 means watch.DefaultDebounce (50 ms); negative or over
	// watch.MaxDebounce (10 s) is InvalidArgument.
	Debounce time.Duration
}

// Watch watches the directory path (absolute; a symlink to a directory is
// followed, symlinks below it never are) with the service's identity, and
// returns once it is watched; see package watch for the events. The watch
// ends when ctx ends or the Watcher is closed. A missing path is NotFound,
// a file FailedPrecondition; more than Config.MaxWatches watches at once,
// or more than Config.MaxWatchDirs directories watched by all of them, is
// ResourceExhausted (a running watch that outgrows the directory budget
// ends with that error).
// isUploadTemp reports whether a base name is an upload's temporary file:
// a watch does not show them, and shows the upload as its target's
// creation however the kernel's events fell into bursts.
func isUploadTemp(name string) bool { return strings.HasPrefix(name, TempPrefix) }

func (f *FS) Watch(ctx context.Context, path string, opts WatchOptions) (*watch.Watcher, error) {
	p, err := checkPath("path", path, true)
	if err != nil {
		return nil, err
	}
	if opts.Debounce < 0 || opts.Debounce > watch.MaxDebounce {
		return nil, errdefs.InvalidArgument("debounce", "must be between 0 and %v, got %v", watch.MaxDebounce, opts.Debounce)
	}
	lim := f.watches
	if err := lim.StartWatch(); err != nil {
		return nil, err
	}
	w, err := watch.Start(ctx, p, watch.Options{
		Recursive: opts.Recursive,
		Debounce:  opts.Debounce,
		Dirs:      lim,
		As:        f.as,
		MapErr:    osError,
		Logger:    f.log,
		OnEnd:     lim.EndWatch,
		Hidden:    isUploadTemp,
	})
	if err != nil {
		lim.EndWatch()
		return nil, err
	}
	return w, nil
}
