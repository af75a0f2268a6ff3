//go:build race && !deadlocks

package containerd

import "github.com/sasha-s/go-deadlock"

// go-cni swaps its sync.RWMutex for github.com/sasha-s/go-deadlock's in
// builds with -race. With Go 1.26 go-deadlock cannot tell goroutines apart
// (every goroutine id reads as 0), so two concurrent CNI calls (RLock by two
// goroutines) look like recursive locking and it kills the process. Race
// builds of berth keep the race detector and turn the deadlock detector off;
// build with -tags deadlocks to get it back.
func init() { deadlock.Opts.Disable = true }
