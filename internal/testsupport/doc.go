// Package testsupport holds what tests share and nothing else: testenv (the
// skip-or-fail rule for missing daemons, images and tools), orchtest (an
// orchestrator on the in-process runtime), testserve (an agent served on a
// loopback listener), uploadtest (raw upload clients) and streamtest
// (log follows for the stream limit tests). Production code
// never imports these packages; they sit apart from the bottom layer of
// internal/ (edge, listenmux, memlisten, hostfw, logx, version), which the
// product's packages build on.
package testsupport
