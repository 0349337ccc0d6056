// Command sandbox-sweep stops and removes every pod sandbox of a CRI runtime, so that the
// runtime tears down each pod's network (CNI DEL: veth, IP address, network namespace)
// before the test cluster's containerd is stopped. It is what `crictl rmp -af` does, in
// a few lines on the CRI API the kubelet itself uses.
//
// Usage: sandbox-sweep unix:///path/to/containerd.sock
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
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: sandbox-sweep unix:///path/to/runtime.sock")
		os.Exit(2)
	}
	conn, err := grpc.NewClient(os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-sweep: %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	defer conn.Close()
	runtime := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list, err := runtime.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-sweep: listing sandboxes: %v\n", err)
		os.Exit(1)
	}
	failed := 0
	for _, sandbox := range list.Items {
		name := sandbox.GetMetadata().GetNamespace() + "/" + sandbox.GetMetadata().GetName()
		if _, err := runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-sweep: stopping %s (%s): %v\n", name, sandbox.Id, err)
			failed++
			continue
		}
		if _, err := runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-sweep: removing %s (%s): %v\n", name, sandbox.Id, err)
			failed++
			continue
		}
		fmt.Printf("removed sandbox %s\n", name)
	}
	if failed > 0 {
		os.Exit(1)
	}
}
