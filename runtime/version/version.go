// Package version holds the build version of the binaries. It is set at link
// time:
//
//	go build -ldflags "-X github.com/idempotency-dev/idc-operator/runtime/version.Version=v0.1.0"
package version

// Version is the release this binary was built from; "dev" for a plain
// `go build`.
var Version = "dev"
