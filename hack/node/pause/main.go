// Command pause is a minimal pod sandbox ("infra") process: it blocks until
// SIGINT/SIGTERM, and reaps zombies when it is PID 1 of a shared PID namespace.
// It is the node's sandbox image (registry.k8s.io/pause:3.10 in the node's
// containerd config), built by `make pause-image`: no registry is reachable here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		switch s {
		case syscall.SIGCHLD:
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		default:
			os.Exit(0)
		}
	}
}
