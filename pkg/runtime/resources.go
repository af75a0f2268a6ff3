package runtime

import "github.com/berth-dev/berth/pkg/errdefs"

// Per-sandbox limits of a backend whose configuration sets none (see
// DefaultResources).
const (
	// DefaultNanoCPUs is one CPU.
	DefaultNanoCPUs int64 = 1_000_000_000
	// DefaultMemoryBytes is 512 MiB (swap disabled).
	DefaultMemoryBytes int64 = 512 << 20
	// DefaultPidsLimit is 512 processes.
	DefaultPidsLimit int64 = 512
)

// DefaultResources returns the limits a backend applies to the zero fields
// of its configured defaults: one CPU, 512 MiB of memory without swap, 512
// processes and no disk limit. It is a function, not a variable, so no
// importer can change the policy of every backend.
func DefaultResources() Resources {
	return Resources{NanoCPUs: DefaultNanoCPUs, MemoryBytes: DefaultMemoryBytes, PidsLimit: DefaultPidsLimit}
}

// WithDefaults returns r with each zero field taken from d. The lease
// manager fills an acquire's limits from its configured defaults with it,
// and every backend fills a Spec's from its own, so "zero means the
// default" means the same everywhere.
func (r Resources) WithDefaults(d Resources) Resources {
	if r.NanoCPUs == 0 {
		r.NanoCPUs = d.NanoCPUs
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = d.MemoryBytes
	}
	if r.PidsLimit == 0 {
		r.PidsLimit = d.PidsLimit
	}
	if r.DiskBytes == 0 {
		r.DiskBytes = d.DiskBytes
	}
	return r
}

// Validate checks limits: none negative, memory at least 6 MiB, disk at
// least 1 MiB and CPU at least 0.01 when set. field prefixes the names in errors.
func (r Resources) Validate(field string) error {
	switch {
	case r.NanoCPUs < 0:
		return errdefs.InvalidArgument(field+".nano_cpus", "must not be negative, got %d", r.NanoCPUs)
	case r.NanoCPUs > 0 && r.NanoCPUs < 10_000_000:
		return errdefs.InvalidArgument(field+".nano_cpus", "must be at least 0.01 CPU (1e7), got %d", r.NanoCPUs)
	case r.MemoryBytes < 0:
		return errdefs.InvalidArgument(field+".memory_bytes", "must not be negative, got %d", r.MemoryBytes)
	case r.MemoryBytes > 0 && r.MemoryBytes < 6<<20:
		return errdefs.InvalidArgument(field+".memory_bytes", "must be at least 6 MiB, got %d", r.MemoryBytes)
	case r.PidsLimit < 0:
		return errdefs.InvalidArgument(field+".pids_limit", "must not be negative, got %d", r.PidsLimit)
	case r.DiskBytes < 0:
		return errdefs.InvalidArgument(field+".disk_bytes", "must not be negative, got %d", r.DiskBytes)
	case r.DiskBytes > 0 && r.DiskBytes < 1<<20:
		return errdefs.InvalidArgument(field+".disk_bytes", "must be at least 1 MiB, got %d", r.DiskBytes)
	}
	return nil
}

// OutputLimit bounds the output a sandbox's main process (the agent, PID
// 1, and whatever writes to its stdout and stderr) leaves on the host: the
// engine keeps at most MaxFiles files of at most MaxBytes each, rotating
// (Docker: the json-file log driver's max-size and max-file; containerd:
// berth's logging binary, see package shimlog). It is the host's disk,
// not the sandbox's: the disk limit does not count it.
type OutputLimit struct {
	// MaxBytes is the size of one file; default DefaultOutputMaxBytes.
	MaxBytes int64
	// MaxFiles is the number of files kept, the one being written
	// included; default DefaultOutputMaxFiles.
	MaxFiles int
}

// The defaults of OutputLimit: 10 MiB × 2.
const (
	DefaultOutputMaxBytes = 10 << 20
	DefaultOutputMaxFiles = 2
)

// WithDefaults returns o with zero fields set to the defaults.
func (o OutputLimit) WithDefaults() OutputLimit {
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultOutputMaxBytes
	}
	if o.MaxFiles <= 0 {
		o.MaxFiles = DefaultOutputMaxFiles
	}
	return o
}
