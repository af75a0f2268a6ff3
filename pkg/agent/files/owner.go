package files

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// chown gives path to the sandbox's default user (Config.Chown), if set.
func (f *FS) chown(path string) error {
	if f.chownFn == nil {
		return nil
	}
	return f.chownFn(path)
}

// mkdirAll is os.MkdirAll(dir, 0o755) that also gives every directory it
// creates to the sandbox's default user.
func (f *FS) mkdirAll(dir string) error {
	if f.chownFn == nil {
		return os.MkdirAll(dir, 0o755)
	}
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, fs.ErrNotExist) {
			break
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := f.chownFn(missing[i]); err != nil {
			return err
		}
	}
	return nil
}
