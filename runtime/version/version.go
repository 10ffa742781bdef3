// Package version holds the build version of the binaries. It is set at link
// time:
//
//	go build -ldflags "-X github.com/idempotency-dev/idc-operator/runtime/version.Version=0.2.0 \
//	  -X github.com/idempotency-dev/idc-operator/runtime/version.Commit=$(git rev-parse --short=12 HEAD)"
//
// The Makefile (`make build`, `make image`) and the Dockerfile set both.
package version

// Version is the release this binary was built from; "dev" for a plain
// `go build`.
var Version = "dev"

// Commit is the source revision; "unknown" for a plain `go build`.
var Commit = "unknown"

// String is what `idc-runtime version` and `manager --version` print.
func String() string { return Version + " (commit " + Commit + ")" }
