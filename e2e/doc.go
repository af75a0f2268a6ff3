// Package e2e holds berth's end-to-end tests and benchmarks. They run the
// real orchestrator (in-process through orchestrator.New, and as the built
// bin/orchestrator) against the real Docker Engine, and talk to the real
// sandbox-agent inside the containers it creates.
//
// TestMain builds sandbox-agent and orchestrator (CGO_ENABLED=0) into a
// temporary directory and imports a shell-less image from an empty root
// filesystem. Tests skip with a message when Docker is unreachable, and the
// cases that need berth/base or berth/minimal skip when those are absent
// (build them with `make images`). Every test uses its own data directory
// and orchestrator instance id, and removes every container carrying that
// instance label when it ends, pass or fail.
//
//	go test -count=1 -race ./e2e/
//	go test -run '^$' -bench . -benchtime 20x ./e2e/
//
// Set BERTH_E2E_LOG=1 to stream the orchestrators' logs to stderr; they are
// printed anyway for a failed test.
package e2e
