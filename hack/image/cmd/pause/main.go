// Command pause holds a pod's namespaces open and does nothing else: the e2e node's
// sandbox image, in place of registry.k8s.io/pause, which cannot be pulled here. As
// PID 1 of the sandbox it exits on SIGINT or SIGTERM, when the kubelet stops the pod.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
