package runtime

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// TestParseImageRef: every spelling of a snapshot reference is recognised
// (so it goes through the owner check), ids, id prefixes and digests into
// the snapshot repository are refused naming the field, and what the
// engine is given is the normalised reference.
func TestParseImageRef(t *testing.T) {
	id := "c50a61d3312c913b5eb65266c5accb065dd1217e9e55f01140976d622e603d8e"
	for _, tc := range []struct {
		in      string
		ref     string // want Ref ("" : an error)
		snapTag string // want SnapshotTag when a snapshot
	}{
		{in: "berth/base", ref: "berth/base"},
		{in: "berth/base:latest", ref: "berth/base:latest"},
		{in: "docker.io/berth/base:1", ref: "berth/base:1"},
		{in: "index.docker.io/berth/base:1", ref: "berth/base:1"},
		{in: "docker.io/library/debian:12", ref: "debian:12"},
		{in: "library/debian", ref: "debian"},
		{in: "python:3", ref: "python:3"},
		{in: "ghcr.io/x/y:1", ref: "ghcr.io/x/y:1"},
		{in: "berth/base@sha256:" + id, ref: "berth/base@sha256:" + id},
		{in: "berth/snapshots:x", ref: "berth/snapshots:x"},
		{in: "localhost/berth/snapshot:x", ref: "localhost/berth/snapshot:x"},
		// Every spelling of the snapshot repository is a snapshot.
		{in: "berth/snapshot:base", ref: "berth/snapshot:base", snapTag: "base"},
		{in: "docker.io/berth/snapshot:base", ref: "berth/snapshot:base", snapTag: "base"},
		{in: "index.docker.io/berth/snapshot:base", ref: "berth/snapshot:base", snapTag: "base"},
		{in: "berth/snapshot", ref: "berth/snapshot", snapTag: "latest"},
		{in: "docker.io/berth/snapshot", ref: "berth/snapshot", snapTag: "latest"},
		{in: "berth/snapshot:BASE", ref: "berth/snapshot:BASE", snapTag: "BASE"},
		// Refused: ids, id prefixes, digests into the snapshot repository,
		// upper case, junk.
		{in: id},
		{in: "sha256:" + id},
		{in: id[:12]},
		{in: "sha256:" + id[:8]},
		{in: "c"},
		{in: "C50A61D3312C"},
		{in: "library/" + id[:12]},
		{in: "docker.io/library/" + id[:12] + ":latest", ref: id[:12] + ":latest"},
		{in: "docker.io/library/sha256:" + id[:12]},
		{in: "sha512:abc"},
		{in: "berth/snapshot@sha256:" + id},
		{in: "docker.io/berth/snapshot:base@sha256:" + id},
		// An upper-case first part is a registry host to the engines too.
		{in: "Berth/snapshot:base", ref: "Berth/snapshot:base"},
		{in: "berth/Snapshot:base"},
		{in: "berth/snapshot:"},
		{in: "berth/snapshot:a b"},
		{in: ""},
	} {
		got, err := ParseImageRef("image", tc.in)
		if tc.ref == "" {
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "image") {
				t.Errorf("ParseImageRef(%q) = %+v, %v; want InvalidArgument naming image", tc.in, got, err)
			}
			continue
		}
		if err != nil || got.Ref != tc.ref || got.Snapshot != (tc.snapTag != "") || got.SnapshotTag != tc.snapTag {
			t.Errorf("ParseImageRef(%q) = %+v, %v; want ref %q snapshot tag %q", tc.in, got, err, tc.ref, tc.snapTag)
		}
	}
}

func TestSnapshotTag(t *testing.T) {
	a, b := SnapshotTag("i", "team-a", "base"), SnapshotTag("i", "team-b", "base")
	if a == b || a == SnapshotTag("j", "team-a", "base") || !strings.HasPrefix(a, "base-") {
		t.Errorf("tags: %s %s", a, b)
	}
	if SnapshotTag("i", "a\x00b", "c") == SnapshotTag("i", "a", "b\x00c") {
		t.Error("owner and name are not separated")
	}
	long := SnapshotTag("i", "o", strings.Repeat("x", MaxSnapshotName))
	for _, tag := range []string{a, long} {
		if err := ValidSnapshotName("tag", tag); err != nil {
			t.Errorf("tag %s: %v", tag, err)
		}
	}
	for in, want := range map[string]string{
		"berth/snapshot:" + a:           a,
		"docker.io/berth/snapshot:" + a: a,
		"berth/snapshot":                "",
		"berth/base:" + a:               "",
	} {
		got, ok := SnapshotTagOf(in)
		if got != want || ok != (want != "") {
			t.Errorf("SnapshotTagOf(%q) = %q %v, want %q", in, got, ok, want)
		}
	}
}
