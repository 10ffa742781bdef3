// Package testbin builds this repository's binaries for tests that run them
// as real processes.
package testbin

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// RuntimePackage is the import path of the idc-runtime command.
const RuntimePackage = "github.com/idempotency-dev/idc-operator/cmd/idc-runtime"

// Build compiles pkg into the test's temporary directory and returns the
// binary's path; a build failure fails the test with the compiler output.
func Build(t testing.TB, pkg, name string) string {
	t.Helper()
	// go test puts its own GOROOT/bin first on PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build %s: %v", name, err)
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command(goBin, "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, out)
	}
	return bin
}
