package runtime_test

import (
	"slices"
	"testing"

	"github.com/berth-dev/berth/pkg/runtime"
)

// TestCapabilitiesCannotBeChanged checks that the capability policy is a
// fresh copy each time, so no importer can widen it for everyone, and that
// the capabilities berth drops on purpose are not in it.
func TestCapabilitiesCannotBeChanged(t *testing.T) {
	first := runtime.Capabilities()
	want := slices.Clone(first)
	first[0] = "SYS_ADMIN"
	_ = append(first, "NET_RAW")
	if got := runtime.Capabilities(); !slices.Equal(got, want) {
		t.Fatalf("Capabilities() = %v after a caller changed its copy, want %v", got, want)
	}
	for _, dropped := range []string{"NET_RAW", "MKNOD", "SYS_CHROOT", "AUDIT_WRITE", "SETFCAP", "SYS_ADMIN"} {
		if slices.Contains(want, dropped) {
			t.Errorf("Capabilities() keeps %s", dropped)
		}
	}
	for _, needed := range []string{"SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE", "FOWNER"} {
		if !slices.Contains(want, needed) {
			t.Errorf("Capabilities() lacks %s, which the agent needs to run commands as the lease's user and give it its files", needed)
		}
	}
}
