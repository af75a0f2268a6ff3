package shimlog

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestRotatorBounds writes far more than the bound in writes of every
// size: the files never pass MaxBytes each nor MaxFiles in number, the
// newest bytes are kept in order, and a reopened log appends.
func TestRotatorBounds(t *testing.T) {
	for _, files := range []int{1, 2, 3} {
		t.Run(strconv.Itoa(files), func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "log")
			r, err := Open(path, 1000, files)
			if err != nil {
				t.Fatal(err)
			}
			var all bytes.Buffer
			for i := range 500 {
				chunk := bytes.Repeat([]byte{byte('a' + i%26)}, i%97+1)
				if i%50 == 0 {
					chunk = bytes.Repeat([]byte{'Z'}, 2500) // one write past the bound
				}
				if n, err := r.Write(chunk); err != nil || n != len(chunk) {
					t.Fatalf("write %d: %d, %v", i, n, err)
				}
				all.Write(chunk)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) > files {
				t.Fatalf("%d files, want at most %d", len(ents), files)
			}
			var kept []byte
			for i := files - 1; i >= 0; i-- {
				p := path
				if i > 0 {
					p += "." + strconv.Itoa(i)
				}
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if len(b) > 1000 {
					t.Fatalf("%s holds %d bytes, want at most 1000", p, len(b))
				}
				kept = append(kept, b...)
			}
			if !bytes.HasSuffix(all.Bytes(), kept) || len(kept) <= (files-1)*1000 {
				t.Fatalf("kept %d bytes, not the newest in order", len(kept))
			}
			r2, err := Open(path, 1000, files)
			if err != nil {
				t.Fatal(err)
			}
			defer r2.Close()
			before, _ := os.ReadFile(path)
			if _, err := r2.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadFile(path)
			if len(before) < 1000 && !bytes.Equal(after, append(before, 'x')) {
				t.Fatal("a reopened log does not append")
			}
		})
	}
}

func TestArg(t *testing.T) {
	p, n, f, err := decode(Encode("/var/lib/berth/x/log", 10<<20, 2))
	if err != nil || p != "/var/lib/berth/x/log" || n != 10<<20 || f != 2 {
		t.Fatalf("%q %d %d %v", p, n, f, err)
	}
	for _, bad := range []string{"", "1:2", "0:2:/x", "1:0:/x", "1:2:rel", "x:2:/x"} {
		if _, _, _, err := decode(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if ok, _ := Main([]string{"--listen", "x"}); ok {
		t.Error("Main took the agent's own arguments")
	}
}
