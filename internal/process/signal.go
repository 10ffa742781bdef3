package process

import (
	"context"
	"os/signal"
	"syscall"
)

// SignalContext is cancelled by the first SIGTERM or SIGINT; after it a
// second one kills the process at once (the default action). stop releases
// the signals early.
func SignalContext() (ctx context.Context, stop context.CancelFunc) {
	ctx, stop = signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ctx.Done()
		// Restores the default action: a second signal is not caught.
		stop()
	}()
	return ctx, stop
}
