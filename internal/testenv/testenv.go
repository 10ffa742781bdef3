// Package testenv starts envtest's control plane (a real kube-apiserver and
// etcd) with the CRDs of this repository installed. The binaries are built
// from the Go module proxy by hack/build-envtest.sh, because setup-envtest
// cannot download them on machines without internet access.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Assets returns the directory holding kube-apiserver and etcd: the
// KUBEBUILDER_ASSETS environment variable when set (make test sets it), else
// the output of hack/build-envtest.sh, which builds them on first use.
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "build-envtest.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building the envtest binaries with hack/build-envtest.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// New returns an envtest environment with the CRDs installed; the caller
// calls Start and Stop.
func New() (*envtest.Environment, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	return &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}, nil
}
