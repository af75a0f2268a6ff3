// Package statefile is the agent's state file: the environment and
// secrets of the lease that claimed a pooled sandbox, kept in the
// sandbox's agent state directory (runtime.AgentStateDir), so that a
// restarted container's agent applies them again.
//
// The file is also the cheaper of the two ways a claim configures the
// agent. Over gRPC, ConfigService.Configure wakes the idle agent, which
// writes the file itself. Where the orchestrator sees the directory on its
// own host (the Docker and containerd backends on the engine's host),
// WriteClaim writes the file there instead, without a call to the agent,
// and the agent applies it before its first command. The protocol:
//
//  1. At its start, an agent that can be configured this way makes the
//     file empty, holds it open, and then creates the Marker file next to
//     it. An agent without the marker (an older one, or one that could not
//     hold the file) is configured over gRPC.
//  2. WriteClaim checks the marker and that the file is still empty (a
//     sandbox is configured once), then writes the configuration into it
//     with one write at offset 0 when it fits in one page (InPlaceMax),
//     else into a new file renamed over it. The write in place is the
//     cheap one: a rename over a file makes ext4 flush the new file's
//     data at once (auto_da_alloc), about 0.1 ms of the writer's CPU and
//     more of the kernel's.
//  3. The agent, before any command starts, sees that the file it holds
//     open is no longer empty, or has no name any more (its link count is
//     0), and reads the configuration (Claimed).
//
// The claim answers READY only after the write, so every command of the
// lease starts after it.
package statefile

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"github.com/berth-dev/berth/pkg/errdefs"
)

// Name is the state file's name in the agent's state directory.
const Name = "configure.json"

// Marker is the file an agent creates in its state directory once it
// holds an empty state file open and watches for WriteClaim's (step 1 of
// the protocol).
const Marker = "configure.by-file"

// Config is what a claim gives the agent, and what the state file holds.
type Config struct {
	// Env is added to every command's environment.
	Env map[string]string `json:"env,omitempty"`
	// Secrets are added to the environment too, and masked in output.
	Secrets map[string]string `json:"secrets,omitempty"`
}

// Encode returns c as the state file's bytes.
func Encode(c Config) ([]byte, error) { return json.Marshal(c) }

// Decode parses the state file's bytes.
func Decode(b []byte) (Config, error) {
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return Config{}, fmt.Errorf("decode the agent's state file: %w", err)
	}
	return c, nil
}

// ErrNotLocal is returned by WriteClaim when the directory cannot be
// used: not on this host, or its agent does not follow the protocol (no
// Marker, no empty state file). The caller configures the agent over gRPC
// instead.
var ErrNotLocal = errors.New("the agent's state directory cannot be written from here")

// Usable reports whether WriteClaim can configure the agent whose state
// directory is dir: the Marker is there and the state file is empty.
func Usable(dir string) bool {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return false
	}
	defer root.Close()
	_, err = blank(root, dir)
	return err == nil
}

// blank checks, in root (the state directory dir), that the agent follows
// the protocol (Marker) and that its state file is empty, and returns the
// state file's FileInfo.
func blank(root *os.Root, dir string) (fs.FileInfo, error) {
	if fi, err := root.Lstat(Marker); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: no %s in %s", ErrNotLocal, Marker, dir)
	}
	fi, err := root.Lstat(Name)
	if err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: no state file %s in %s", ErrNotLocal, Name, dir)
	}
	if fi.Size() > 0 {
		return nil, ErrConfigured()
	}
	return fi, nil
}

// ErrConfigured returns the answer to a second configuration of one
// sandbox, through its state file or the agent's Configure alike
// (errdefs.ErrFailedPrecondition).
func ErrConfigured() error {
	return errdefs.FailedPrecondition("this sandbox was configured already: a claimed sandbox is never configured twice")
}

// InPlaceMax is the largest configuration WriteClaim writes into the
// empty state file in place: one page, which a single write(2) at offset
// 0 of a regular file copies whole or, when the writer is killed first,
// not at all.
const InPlaceMax = 4096

// WriteClaim configures the agent whose state directory is dir (a path on
// this host) with c, by writing its empty state file (steps 2 and 3 of
// the protocol). A state file that is not empty is
// errdefs.ErrFailedPrecondition, as the agent's Configure answers. A
// file written through a rename gets the empty one's owner and mode 0600.
// Every path is resolved inside dir (os.Root): a symbolic link out of it
// is refused.
func WriteClaim(dir string, c Config) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotLocal, err)
	}
	defer root.Close()
	fi, err := blank(root, dir)
	if err != nil {
		return err
	}
	b, err := Encode(c)
	if err != nil {
		return err
	}
	if len(b) <= InPlaceMax {
		return writeInPlace(root, dir, b)
	}
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	tmp := ".configure-" + hex.EncodeToString(suffix[:])
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		// Nothing written (say, no permission): gRPC can still do it.
		return fmt.Errorf("%w: create a file in %s: %v", ErrNotLocal, dir, err)
	}
	err = writeOwned(f, b, fi)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, Name)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("write the agent's state file in %s: %w", dir, err)
	}
	return nil
}

// writeInPlace writes b into the empty state file in root with one write
// at offset 0.
func writeInPlace(root *os.Root, dir string, b []byte) error {
	f, err := root.OpenFile(Name, os.O_WRONLY, 0)
	if err != nil {
		// Nothing written (say, no permission): gRPC can still do it.
		return fmt.Errorf("%w: open the state file in %s: %v", ErrNotLocal, dir, err)
	}
	err = writeEmpty(f, dir, b)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("write the agent's state file in %s: %w", dir, cerr)
	}
	return err
}

// writeEmpty writes b at offset 0 of f, the state file in dir, if f is
// still an empty regular file.
func writeEmpty(f *os.File, dir string, b []byte) error {
	fi, err := f.Stat()
	switch {
	case err != nil:
		return fmt.Errorf("write the agent's state file in %s: %w", dir, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%w: the state file in %s is not a regular file", ErrNotLocal, dir)
	case fi.Size() > 0:
		return ErrConfigured()
	}
	if n, err := f.WriteAt(b, 0); err != nil || n != len(b) {
		// Nothing or part of it written: the agent fails its commands on
		// a file it cannot parse rather than run them unconfigured.
		return fmt.Errorf("write the agent's state file in %s: %d of %d bytes: %v", dir, n, len(b), err)
	}
	return nil
}

// writeOwned writes b to f and gives f the owner of like (the agent's
// empty file: the agent reads the new one with its own identity, which
// on an engine that remaps users is not the orchestrator's).
func writeOwned(f *os.File, b []byte, like fs.FileInfo) error {
	if _, err := f.Write(b); err != nil {
		return err
	}
	st, ok := like.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) == os.Geteuid() && int(st.Gid) == os.Getegid() {
		return nil
	}
	return f.Chown(int(st.Uid), int(st.Gid))
}

// Claimed reports whether WriteClaim configured the agent through f, the
// empty state file the agent holds open (step 3): f is no longer empty,
// or a configuration was renamed over its name (no link left).
func Claimed(f *os.File) (bool, error) {
	fi, err := f.Stat()
	if err != nil {
		return false, err
	}
	if fi.Size() > 0 {
		return true, nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Nlink == 0, nil
}
