package main

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// join stops the relay and returns only once the relay's Run has returned:
// the publisher is closed and the last progress record written after it.
func TestStartRelayJoinWaitsForTheRelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var returned atomic.Bool
		run := func(ctx context.Context) error {
			<-ctx.Done() // stopped by join
			<-release    // still shutting down
			returned.Store(true)
			return nil
		}
		loop, stopLoop := context.WithCancelCause(t.Context())
		defer stopLoop(nil)
		join := startRelay(loop, run, stopLoop)
		joined := make(chan error, 1)
		go func() { joined <- join() }()
		// Every goroutine is blocked now: the relay on release, so join
		// must still be waiting for it.
		synctest.Wait()
		select {
		case err := <-joined:
			t.Fatalf("join returned (%v) while the relay was still running", err)
		default:
		}
		close(release)
		if err := <-joined; err != nil {
			t.Fatalf("join: %v, want nil for a relay stopped by join", err)
		}
		if !returned.Load() {
			t.Fatal("join returned before the relay did")
		}
		if loop.Err() != nil {
			t.Fatalf("a relay stopped by join cancelled the loop: %v", context.Cause(loop))
		}
		if err := join(); err != nil {
			t.Fatalf("a second join: %v", err)
		}
	})
}

// A relay that fails on its own stops the loop with its error, and join
// hands that error to the exit path.
func TestStartRelayFailureStopsTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		loop, stopLoop := context.WithCancelCause(t.Context())
		defer stopLoop(nil)
		join := startRelay(loop, func(context.Context) error { return boom }, stopLoop)
		<-loop.Done()
		if !errors.Is(context.Cause(loop), boom) {
			t.Fatalf("loop stopped with %v, want the relay's error", context.Cause(loop))
		}
		if err := join(); !errors.Is(err, boom) {
			t.Fatalf("join: %v, want the relay's error", err)
		}
	})
}
