// Package keda holds no code: the module pins KEDA v2.21.0's module graph so that
// hack/build-keda.sh can build KEDA's own main packages (cmd/operator, cmd/adapter)
// from the Go module proxy, as hack/envtest does for Kubernetes.
package keda
