package lease

import "testing"

// TestMemVolumes checks the in-memory VolumeStore a Manager keeps the
// volume records in when its Store is not a VolumeStore.
func TestMemVolumes(t *testing.T) {
	var s memVolumes
	all := func() map[string]VolumeRecord {
		out := map[string]VolumeRecord{}
		if err := s.ForEachVolume(func(r VolumeRecord) error { out[r.Name] = r; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if err := s.DeleteVolume("none"); err != nil || len(all()) != 0 {
		t.Fatalf("empty store: delete %v, records %v", err, all())
	}
	_ = s.PutVolume(VolumeRecord{Name: "a", Owner: "o"})
	_ = s.PutVolume(VolumeRecord{Name: "b"})
	_ = s.PutVolume(VolumeRecord{Name: "a", Owner: "p"})
	if got := all(); len(got) != 2 || got["a"].Owner != "p" {
		t.Fatalf("records = %v", got)
	}
	_ = s.DeleteVolume("a")
	if got := all(); len(got) != 1 || got["b"].Name != "b" {
		t.Fatalf("after delete: %v", got)
	}
}
