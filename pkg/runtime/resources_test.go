package runtime_test

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
	"github.com/berth-dev/berth/pkg/runtime"
)

// TestWithDefaults: each zero field, and only a zero field, takes the
// default.
func TestWithDefaults(t *testing.T) {
	d := runtime.Resources{NanoCPUs: 2e9, MemoryBytes: 1 << 30, PidsLimit: 100, DiskBytes: 5 << 30}
	for _, tc := range []struct {
		name string
		in   runtime.Resources
		want runtime.Resources
	}{
		{"all zero", runtime.Resources{}, d},
		{"all set", runtime.Resources{NanoCPUs: 1, MemoryBytes: 2, PidsLimit: 3, DiskBytes: 4}, runtime.Resources{NanoCPUs: 1, MemoryBytes: 2, PidsLimit: 3, DiskBytes: 4}},
		{"cpu set", runtime.Resources{NanoCPUs: 5e8}, runtime.Resources{NanoCPUs: 5e8, MemoryBytes: 1 << 30, PidsLimit: 100, DiskBytes: 5 << 30}},
		{"memory set", runtime.Resources{MemoryBytes: 64 << 20}, runtime.Resources{NanoCPUs: 2e9, MemoryBytes: 64 << 20, PidsLimit: 100, DiskBytes: 5 << 30}},
		{"pids set", runtime.Resources{PidsLimit: 7}, runtime.Resources{NanoCPUs: 2e9, MemoryBytes: 1 << 30, PidsLimit: 7, DiskBytes: 5 << 30}},
		{"disk set", runtime.Resources{DiskBytes: 1 << 20}, runtime.Resources{NanoCPUs: 2e9, MemoryBytes: 1 << 30, PidsLimit: 100, DiskBytes: 1 << 20}},
		// A negative field is not zero: it is kept, for Validate to reject.
		{"negative kept", runtime.Resources{PidsLimit: -1}, runtime.Resources{NanoCPUs: 2e9, MemoryBytes: 1 << 30, PidsLimit: -1, DiskBytes: 5 << 30}},
	} {
		if got := tc.in.WithDefaults(d); got != tc.want {
			t.Errorf("%s: %+v.WithDefaults = %+v, want %+v", tc.name, tc.in, got, tc.want)
		}
	}
	if got := (runtime.Resources{NanoCPUs: 3}).WithDefaults(runtime.Resources{}); got != (runtime.Resources{NanoCPUs: 3}) {
		t.Errorf("zero defaults changed a value: %+v", got)
	}
}

// TestDefaultResources: the backends' defaults (1 CPU, 512 MiB, 512 pids,
// no disk limit) are valid, and a caller cannot change them for others.
func TestDefaultResources(t *testing.T) {
	d := runtime.DefaultResources()
	if d != (runtime.Resources{NanoCPUs: 1e9, MemoryBytes: 512 << 20, PidsLimit: 512}) {
		t.Fatalf("DefaultResources() = %+v", d)
	}
	if err := d.Validate("default_resources"); err != nil {
		t.Fatalf("the defaults are invalid: %v", err)
	}
	d.NanoCPUs = 64e9
	if runtime.DefaultResources().NanoCPUs != runtime.DefaultNanoCPUs {
		t.Errorf("changing a returned value changed the default")
	}
}

// TestResourcesValidate names the field and rejects negatives and values
// below the minimums; zero (the default) is always valid.
func TestResourcesValidate(t *testing.T) {
	if err := (runtime.Resources{}).Validate("r"); err != nil {
		t.Errorf("zero: %v", err)
	}
	if err := (runtime.Resources{NanoCPUs: 1e7, MemoryBytes: 6 << 20, PidsLimit: 1, DiskBytes: 1 << 20}).Validate("r"); err != nil {
		t.Errorf("minimums: %v", err)
	}
	for _, tc := range []struct {
		in    runtime.Resources
		field string
	}{
		{runtime.Resources{NanoCPUs: -1}, "r.nano_cpus"},
		{runtime.Resources{NanoCPUs: 1e7 - 1}, "r.nano_cpus"},
		{runtime.Resources{MemoryBytes: -1}, "r.memory_bytes"},
		{runtime.Resources{MemoryBytes: 6<<20 - 1}, "r.memory_bytes"},
		{runtime.Resources{PidsLimit: -1}, "r.pids_limit"},
		{runtime.Resources{DiskBytes: -1}, "r.disk_bytes"},
		{runtime.Resources{DiskBytes: 1<<20 - 1}, "r.disk_bytes"},
	} {
		err := tc.in.Validate("r")
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("%+v: %v, want InvalidArgument naming %s", tc.in, err, tc.field)
		}
	}
}
