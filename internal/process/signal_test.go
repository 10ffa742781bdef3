package process

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// signalChildEnv makes the test binary run signalChild instead of the tests.
const signalChildEnv = "IDC_PROCESS_SIGNAL_CHILD"

// The first SIGTERM cancels the context; a second one kills the process.
// Run in a child process, since that second signal is meant to kill it.
func TestSignalContext(t *testing.T) {
	if os.Getenv(signalChildEnv) != "" {
		signalChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalContext$", "-test.count=1")
	cmd.Env = append(os.Environ(), signalChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if !strings.Contains(string(out), "cancelled by the first signal") {
		t.Fatalf("the first SIGTERM did not cancel the context: %v\n%s", err, out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the child outlived the second SIGTERM: %v\n%s", err, out)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("the child ended with %v, want killed by SIGTERM\n%s", err, out)
	}
}

func signalChild() {
	ctx, stop := SignalContext()
	defer stop()
	_ = syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
	select {
	case <-ctx.Done():
		fmt.Println("cancelled by the first signal")
	case <-time.After(time.Minute):
		fmt.Println("not cancelled")
		os.Exit(3)
	}
	// The default action comes back once the first signal was handled;
	// until then a signal is caught, so it is sent until one kills.
	for range 6000 {
		_ = syscall.Kill(syscall.Getpid(), syscall.SIGTERM)
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("survived")
	os.Exit(0)
}
