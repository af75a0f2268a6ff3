//go:build !linux

package containerd

import "errors"

var errNotLinux = errors.New("the containerd backend runs on Linux only")

func prepareNetnsDir(string) error { return errNotLinux }
func createNetns(string) error     { return errNotLinux }
func removeNetns(string) error     { return nil }
func setPortIsolated(string) error { return errNotLinux }

func removeCgroups(string, string) {}
