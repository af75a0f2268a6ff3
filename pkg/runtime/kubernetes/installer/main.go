// Command installer is the entry point of berth's agent image for the
// Kubernetes backend: the image holds only this program and the static
// sandbox-agent, and runs as the init container of every sandbox Pod,
// where it copies the agent into the emptyDir volume that the sandbox's
// own container mounts read-only at /.berth. (A scratch image has no cp;
// this is that cp, and nothing else.)
//
//	installer SRC DST
//
// DST is written to a temporary file first and renamed, mode 0555.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: installer SRC DST")
		os.Exit(2)
	}
	if err := install(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "installer:", err)
		os.Exit(1)
	}
}

func install(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), ".install-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := tmp.Chmod(0o555); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}
