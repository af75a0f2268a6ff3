package quantity

import (
	"testing"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "1048576": 1048576, " 42 ": 42,
		"2Gi": 2 << 30, "10Gi": 10 << 30, "512Mi": 512 << 20, "1Ki": 1024, "1Ti": 1 << 40, "1Ei": 1 << 60,
		"2GiB": 2 << 30, "1.5Gi": 3 << 29, "0.5Ki": 512, "1.0001Ki": 1025,
		"1k": 1000, "1K": 1000, "10G": 10e9, "10GB": 10e9, "3M": 3e6, "1T": 1e12, "100B": 100,
	} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "-1Gi", "Gi", "2Xi", "2 G i", "1e3", "0x10", "NaN", "Inf", "1_000", "9Ei", "2gi"} {
		if got, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func TestFormatBytesRoundTrip(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1000: "1000", 1024: "1Ki", 1536 << 20: "1536Mi", 2 << 30: "2Gi", 1 << 62: "4Ei"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
		if back, err := ParseBytes(FormatBytes(n)); err != nil || back != n {
			t.Errorf("round trip of %d: %d, %v", n, back, err)
		}
	}
}

func TestParseCPUs(t *testing.T) {
	for in, want := range map[string]float64{"1.5": 1.5, "2": 2, "500m": 0.5, "0": 0, "250m": 0.25} {
		got, err := ParseCPUs(in)
		if err != nil || got != want {
			t.Errorf("ParseCPUs(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "m", "1.5x", "NaN", "Inf", "1e3"} {
		if got, err := ParseCPUs(in); err == nil {
			t.Errorf("ParseCPUs(%q) = %v, want an error", in, got)
		}
	}
}

func TestFlagValues(t *testing.T) {
	var b Bytes
	if err := b.Set("2Gi"); err != nil || b != 2<<30 || b.String() != "2Gi" || b.Type() != "bytes" {
		t.Errorf("Bytes: %v %d %q", err, b, b.String())
	}
	if err := b.Set("lots"); err == nil {
		t.Error("Bytes.Set(lots) succeeded")
	}
	var c CPUs
	if err := c.Set("1.5"); err != nil || c != 1.5 || c.String() != "1.5" || c.Type() != "cpus" {
		t.Errorf("CPUs: %v %v %q", err, c, c.String())
	}
}
