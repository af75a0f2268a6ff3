// Package testsupport holds what tests share and nothing else: testenv (the
// skip-or-fail rule for missing daemons, images and tools), orchtest (an
// orchestrator on the in-process runtime), testserve (a server on a
// loopback listener for the test's length), testagent (a real agent served
// so, with its own workspace directory), k8sclaim (the agent's claim on the
// test cluster), uploadtest (raw upload clients) and streamtest (log
// follows for the stream limit tests). Production code
// never imports these packages; they sit apart from the bottom layer of
// internal/ (edge, listenmux, memlisten, hostfw, logx, version), which the
// product's packages build on.
package testsupport
