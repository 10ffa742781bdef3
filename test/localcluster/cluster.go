// Package localcluster is the harness shared by the e2e suite and `make
// demo`: a local control plane (envtest's kube-apiserver and etcd, built by
// hack/build-envtest.sh), a kubeconfig for it, the repository's binaries, the
// real manager process, the local pod runner set up for idc-runtime pods,
// and the JetStream -> PostgreSQL orders scenario both of them run.
package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// Cluster is a running local control plane.
type Cluster struct {
	env *envtest.Environment
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Client reads and writes core, apps, batch and IdempotentConsumer
	// objects directly (no cache).
	Client client.Client
	// Kubeconfig is the path of a kubeconfig file for the same admin user.
	Kubeconfig string
}

// IdempotentConsumers is the resource of the API, for Table requests.
var IdempotentConsumers = schema.GroupVersionResource{Group: messagingv1alpha1.GroupVersion.Group, Version: messagingv1alpha1.GroupVersion.Version, Resource: "idempotentconsumers"}

// EnvtestBinariesBuilt says whether hack/build-envtest.sh has the control
// plane binaries already (else the first start builds them, ~10+ minutes on
// 2 cores).
func EnvtestBinariesBuilt() bool {
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		return true
	}
	matches, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "bin", "k8s", "*-"+runtime.GOOS+"-"+runtime.GOARCH, "kube-apiserver"))
	return len(matches) > 0
}

// Start starts kube-apiserver and etcd with this repository's CRDs and
// writes dir/kubeconfig.
func Start(dir string) (*Cluster, error) {
	env, err := testenv.New()
	if err != nil {
		return nil, err
	}
	if _, err := env.Start(); err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	c, err := connect(env, dir)
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return c, nil
}

func connect(env *envtest.Environment, dir string) (*Cluster, error) {
	user, err := env.AddUser(envtest.User{Name: "idc-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("adding the admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return nil, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	cfg := user.Config()
	cl, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, fmt.Errorf("building the client: %w", err)
	}
	return &Cluster{env: env, Config: cfg, Client: cl, Kubeconfig: path}, nil
}

// Stop stops kube-apiserver and etcd.
func (c *Cluster) Stop() error {
	if err := c.env.Stop(); err != nil {
		return fmt.Errorf("stopping the control plane: %w", err)
	}
	return nil
}
