// Package bases holds the generated CRD (make manifests) and embeds it, so
// the manager compares the installed CRD with the one it was built with
// (controllers.CheckInstalledCRD). Kustomize and the chart copy only the
// YAML.
package bases

import _ "embed"

// IdempotentConsumers is the CRD YAML of this build.
//
//go:embed messaging.idempotency.dev_idempotentconsumers.yaml
var IdempotentConsumers []byte
