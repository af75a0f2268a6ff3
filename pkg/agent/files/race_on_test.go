//go:build race

package files

// raceEnabled is true when the race detector is on; the large transfer
// tests shrink then, since -race makes them ~10x slower.
const raceEnabled = true
