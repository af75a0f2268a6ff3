package runtime

import (
	"regexp"

	"github.com/distribution/reference"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// snapshotDomain is the registry domain of SnapshotRepository once
// normalised ("berth/snapshot" is "docker.io/berth/snapshot").
const snapshotDomain = "docker.io"

// idLikeRE matches what an engine may read as an image id or a prefix of
// one instead of a name: Docker resolves any hex string ("c", "c50a61",
// "sha256:c50a") it has no tag for as an id prefix, and "sha256:HEX" (with
// 64 digits) as an id.
var idLikeRE = regexp.MustCompile(`^((sha256|sha384|sha512):)?[0-9a-fA-F]+$`)

// digestAlgorithms are the names a familiar reference may not have: an
// engine reads "sha256:TAG" as a digest (an image id).
var digestAlgorithms = map[string]bool{"sha256": true, "sha384": true, "sha512": true}

// ImageRef is an image reference normalised once, the way the engines read
// it (ParseImageRef).
type ImageRef struct {
	// Ref is the normalised reference in its familiar form
	// ("index.docker.io/berth/base:1" is "berth/base:1",
	// "docker.io/library/debian" is "debian"): what the engine is given,
	// so it opens exactly what was checked.
	Ref string
	// Snapshot reports a reference into SnapshotRepository; SnapshotTag is
	// then its tag ("latest" when it has none, as the engines read it).
	Snapshot    bool
	SnapshotTag string
}

// ParseImageRef normalises image once (reference.ParseNormalizedNamed: "x",
// "docker.io/x", "index.docker.io/x" and "docker.io/library/x" are one
// repository) and refuses, as errdefs.ErrInvalidArgument naming field:
//   - what is not a reference (upper-case repositories, spaces, …);
//   - what an engine could read as an image id or an id prefix instead of
//     a name (all hex, "sha256:…", a repository named like a digest
//     algorithm): an id names an image whoever made it, so ids are never
//     accepted;
//   - a digest reference into SnapshotRepository (a snapshot is named, by
//     its owner's name for it, never pinned).
//
// A tagged or untagged reference into SnapshotRepository is returned with
// Snapshot set: the caller must send it through its owner check (the fork
// path) rather than give it to the engine.
func ParseImageRef(field, image string) (ImageRef, error) {
	if idLikeRE.MatchString(image) {
		return ImageRef{}, errdefs.InvalidArgument(field, "%q reads as an image id; image ids and id prefixes are not accepted, name the image (REPOSITORY[:TAG])", image)
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return ImageRef{}, errdefs.InvalidArgument(field, "%q is not an image reference: %v", image, err)
	}
	fam := reference.FamiliarString(named)
	if idLikeRE.MatchString(fam) || digestAlgorithms[reference.FamiliarName(named)] {
		return ImageRef{}, errdefs.InvalidArgument(field, "%q reads as an image id; image ids and id prefixes are not accepted, name the image (REPOSITORY[:TAG])", image)
	}
	out := ImageRef{Ref: fam}
	if reference.Domain(named) != snapshotDomain || reference.Path(named) != SnapshotRepository {
		return out, nil
	}
	if _, ok := named.(reference.Digested); ok {
		return ImageRef{}, errdefs.InvalidArgument(field, "%q: a snapshot is not opened by digest; name it (snapshot NAME)", image)
	}
	out.Snapshot, out.SnapshotTag = true, "latest"
	if tagged, ok := named.(reference.Tagged); ok {
		out.SnapshotTag = tagged.Tag()
	}
	return out, nil
}
