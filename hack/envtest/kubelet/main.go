// Command kubelet: upstream kubelet from k8s.io/kubernetes, built from the Go module proxy for the real node (hack/node).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	// cAdvisor's containerd factory dials its own hard-wired endpoint
	// (/run/containerd/containerd.sock, Go flag "containerd" that the kubelet
	// does not expose). Point it at the CRI socket in use when asked to.
	if ep := os.Getenv("KUBELET_CADVISOR_CONTAINERD"); ep != "" {
		if err := flag.CommandLine.Set("containerd", ep); err != nil {
			fmt.Fprintln(os.Stderr, "cannot set cadvisor containerd endpoint:", err)
		}
	}
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
