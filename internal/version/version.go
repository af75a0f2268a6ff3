// Package version holds the build version, set with -ldflags -X.
package version

// Version is the berth version; "dev" unless set at build time.
var Version = "dev"
