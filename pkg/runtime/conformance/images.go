package conformance

// The images the backends' tests make locally, with no registry: an empty
// root filesystem (no files at all) with a configured user. Each backend's
// TestMain makes every one of TestImages its engine's way (docker import,
// an OCI archive) and gives the suite EmptyImage and BadUserImage.
const (
	// EmptyImage has no files and no user: the agent runs as root.
	EmptyImage = "berth-test/empty:latest"
	// BadUserImage's user does not exist, so its container cannot start
	// (Images.BadUser).
	BadUserImage = "berth-test/baduser:latest"
	// UID1000Image runs as 1000:1000, a user without an /etc/passwd entry.
	UID1000Image = "berth-test/uid1000:latest"
)

// TestImage is one of the images the backends' tests make: Ref, an empty
// root filesystem whose configuration names User ("" for none).
type TestImage struct {
	Ref, User string
}

// TestImages returns the images every backend's TestMain makes.
func TestImages() []TestImage {
	return []TestImage{{EmptyImage, ""}, {BadUserImage, "berth-no-such-user"}, {UID1000Image, "1000:1000"}}
}
