package mask

import (
	"bytes"
	"strings"
	"testing"
)

// stream masks chunks through one Stream and returns everything it emitted.
func stream(m *Masker, chunks ...string) string {
	s := m.Stream()
	var b bytes.Buffer
	for _, c := range chunks {
		b.Write(s.Write([]byte(c)))
	}
	b.Write(s.Close())
	return b.String()
}

func TestBytes(t *testing.T) {
	m := New(map[string]string{"TOKEN": "s3cr3t", "SHORT": "abc", "LONG": "s3cr3t-and-more", "UNI": "päss→wörd"})
	cases := map[string]string{
		"":                   "",
		"no secret here abc": "no secret here abc",
		"x s3cr3t y":         "x <secret:TOKEN> y",
		"s3cr3ts3cr3t":       "<secret:TOKEN><secret:TOKEN>",
		"s3cr3t-and-more!":   "<secret:LONG>!",
		"s3cr3t-and-mor":     "<secret:TOKEN>-and-mor",
		"S3CR3T":             "S3CR3T",
		"ü päss→wörd ü":      "ü <secret:UNI> ü",
		"ss3cr3t":            "s<secret:TOKEN>",
	}
	for in, want := range cases {
		if got := string(m.Bytes([]byte(in))); got != want {
			t.Errorf("Bytes(%q) = %q, want %q", in, got, want)
		}
		if got := stream(m, in); got != want {
			t.Errorf("stream(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNilAndShort(t *testing.T) {
	if m := New(map[string]string{"A": "abc", "B": ""}); m != nil {
		t.Fatalf("New with only short values = %v, want nil", m)
	}
	var m *Masker
	if got := string(m.Bytes([]byte("abc"))); got != "abc" {
		t.Fatalf("nil Bytes = %q", got)
	}
	if got := stream(m, "ab", "c"); got != "abc" {
		t.Fatalf("nil stream = %q", got)
	}
}

// TestEverySplit cuts the input at every pair of positions and checks the
// streamed result equals the whole-buffer result.
func TestEverySplit(t *testing.T) {
	m := New(map[string]string{"A": "abcd", "B": "abcdefgh", "C": "cdefXY", "U": "→ü→"})
	in := "xxabcdefghyyabcdefgzzcdefXYabcabcd→ü→→ü"
	want := string(m.Bytes([]byte(in)))
	if !strings.Contains(want, "<secret:B>") || !strings.Contains(want, "<secret:C>") || !strings.Contains(want, "<secret:U>") {
		t.Fatalf("whole = %q", want)
	}
	for i := 0; i <= len(in); i++ {
		for j := i; j <= len(in); j++ {
			if got := stream(m, in[:i], in[i:j], in[j:]); got != want {
				t.Fatalf("split at %d,%d: %q, want %q", i, j, got, want)
			}
		}
	}
	// One byte at a time.
	var chunks []string
	for i := range len(in) {
		chunks = append(chunks, in[i:i+1])
	}
	if got := stream(m, chunks...); got != want {
		t.Fatalf("bytewise: %q, want %q", got, want)
	}
}

func TestHoldBackBounded(t *testing.T) {
	m := New(map[string]string{"T": "secret-value"})
	s := m.Stream()
	out := string(s.Write([]byte("hello secret-val")))
	if out != "hello " || !s.Pending() {
		t.Fatalf("Write = %q pending=%v", out, s.Pending())
	}
	if got := string(s.Close()); got != "secret-val" {
		t.Fatalf("Close = %q", got)
	}
	if s.Pending() || s.Close() != nil {
		t.Fatal("second Close returned data")
	}
	s = m.Stream()
	if got := string(s.Write([]byte("no prefix at the end"))); got != "no prefix at the end" {
		t.Fatalf("Write = %q", got)
	}
}

func TestManyChunks(t *testing.T) {
	m := New(map[string]string{"TOKEN": "tok-1234567890"})
	var chunks []string
	var want strings.Builder
	for i := range 1000 {
		chunks = append(chunks, "line tok-12345", "67890 end\n")
		if i%7 == 0 {
			chunks = append(chunks, "t", "ok-1234567", "89", "0\n")
			want.WriteString("line <secret:TOKEN> end\n<secret:TOKEN>\n")
			continue
		}
		want.WriteString("line <secret:TOKEN> end\n")
	}
	if got := stream(m, chunks...); got != want.String() {
		t.Fatalf("got %d bytes, want %d", len(got), want.Len())
	}
}
