// Command cri-clean stops and removes every pod sandbox (and any container)
// known to a CRI runtime, like `crictl rmp -fa`: the runtime itself runs CNI DEL,
// releases the pod IP and removes the network namespace.
//
//	cri-clean [unix:///path/to/containerd.sock]
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	ep := os.Getenv("CONTAINER_RUNTIME_ENDPOINT")
	if len(os.Args) > 1 {
		ep = os.Args[1]
	}
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rc := 0
	pods, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "list sandboxes:", err)
		os.Exit(1)
	}
	for _, p := range pods.Items {
		name := p.Metadata.Namespace + "/" + p.Metadata.Name
		if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			fmt.Printf("stop %s: %v\n", name, err)
			rc = 1
		}
		if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: p.Id}); err != nil {
			fmt.Printf("remove %s: %v\n", name, err)
			rc = 1
			continue
		}
		fmt.Printf("removed sandbox %.13s %s\n", p.Id, name)
	}
	cs, err := rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err == nil {
		for _, c := range cs.Containers {
			rs.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: c.Id, Timeout: 5})
			if _, err := rs.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: c.Id}); err != nil {
				fmt.Printf("remove container %.13s: %v\n", c.Id, err)
				rc = 1
			}
		}
	}
	os.Exit(rc)
}
