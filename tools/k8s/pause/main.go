// Command pause is the test cluster's pod sandbox ("pause") process: it
// holds the pod's namespaces, reaps the zombies it inherits as PID 1 and
// exits on SIGINT or SIGTERM. Built static and imported into the node's
// containerd so that no registry is needed.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
