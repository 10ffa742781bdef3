// Package e2e runs the operator end to end on a REAL single-node cluster
// (`make node-up`, hack/node.sh): the image built by `make image` and
// imported into the node's containerd, installed with `kubectl apply
// --server-side -f dist/install.yaml`, the manager as a Pod under its own
// ServiceAccount and the generated RBAC with leader election on, and every
// runtime pod run by the kubelet in a namespace that enforces PodSecurity
// `restricted`. The brokers and PostgreSQL are the machine's own services,
// reached by pods through the node's forwards on the bridge gateway; Kafka is
// franz-go's kfake, served by the test on the bridge IP (no Kafka server
// exists here). A missing node or service fails the suite; it never skips.
//
// `make test-e2e` sets the environment: IDC_E2E_KUBECONFIG, IDC_E2E_INSTALL,
// IDC_E2E_KUBECTL, IDC_E2E_HELM, IDC_E2E_PLUGIN (bin/kubectl-idc), IDC_E2E_IMAGE, IDC_E2E_IMAGE_ID (the config digest of the
// image `make image` built), IDC_E2E_VERSION and IDC_E2E_AUDIT_LOG.
package e2e

import (
	"fmt"
	"os"
	"testing"
)

// env is the suite's environment, read once.
var env struct {
	kubeconfig, install, kubectl, helm, plugin, image, imageID, version, auditLog string
}

func TestMain(m *testing.M) {
	env.kubeconfig = os.Getenv("IDC_E2E_KUBECONFIG")
	env.install = os.Getenv("IDC_E2E_INSTALL")
	env.kubectl = os.Getenv("IDC_E2E_KUBECTL")
	env.helm = os.Getenv("IDC_E2E_HELM")
	env.plugin = os.Getenv("IDC_E2E_PLUGIN")
	env.image = os.Getenv("IDC_E2E_IMAGE")
	env.imageID = os.Getenv("IDC_E2E_IMAGE_ID")
	env.version = os.Getenv("IDC_E2E_VERSION")
	env.auditLog = os.Getenv("IDC_E2E_AUDIT_LOG")
	for name, v := range map[string]string{
		"IDC_E2E_KUBECONFIG": env.kubeconfig, "IDC_E2E_INSTALL": env.install, "IDC_E2E_KUBECTL": env.kubectl, "IDC_E2E_HELM": env.helm, "IDC_E2E_PLUGIN": env.plugin,
		"IDC_E2E_IMAGE": env.image, "IDC_E2E_IMAGE_ID": env.imageID, "IDC_E2E_VERSION": env.version, "IDC_E2E_AUDIT_LOG": env.auditLog,
	} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "e2e: %s is not set: run the suite with `make test-e2e` on a running node (`make node-up`)\n", name)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}
