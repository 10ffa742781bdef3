// Package testenv starts envtest's control plane (a real kube-apiserver and
// etcd) with the CRDs of this repository installed. The binaries are built
// from the Go module proxy by hack/build-envtest.sh, because setup-envtest
// cannot download them on machines without internet access.
package testenv

import (
	"encoding/json"
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

// KEDAVersion is the KEDA release whose CRDs the envtest suites install
// and whose operator make keda runs (hack/keda/go.mod pins it).
const KEDAVersion = "v2.21.0"

// KEDACRDs is the directory of KEDA's own CRDs (config/crd/bases) in the Go
// module cache, downloaded through the module proxy when missing: the
// envtest suites install them unchanged, so what the controller renders is
// checked against KEDA's real schema.
func KEDACRDs() (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", "github.com/kedacore/keda/v2@"+KEDAVersion)
	cmd.Dir = filepath.Join(RepoRoot(), "hack", "keda")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("downloading KEDA %s's module for its CRDs: %w", KEDAVersion, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("reading the KEDA module's directory from go mod download (%s): %w", out, err)
	}
	return filepath.Join(mod.Dir, "config", "crd", "bases"), nil
}
