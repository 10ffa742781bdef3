package sinktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

func claims(t *testing.T, h Harness) {
	e := setup(t, h)
	tx := e.begin(t)
	wantSet(t, "first claim (a repeated in the batch)", e.claim(t, tx, "b", "a", "a"), "a", "b")
	wantSet(t, "same ids in the same transaction", e.claim(t, tx, "a", "b"))
	commit(t, tx)

	tx = e.begin(t)
	wantSet(t, "claim after commit", e.claim(t, tx, "b", "c"), "c")
	if err := tx.Rollback(ctx(t)); err != nil {
		t.Fatal(err)
	}
	tx = e.begin(t)
	wantSet(t, "a rolled-back claim is not kept", e.claim(t, tx, "c"), "c")
	if err := e.in.Unclaim(ctx(t), tx, []string{"c"}); err != nil {
		t.Fatalf("Unclaim: %v", err)
	}
	commit(t, tx)
	tx = e.begin(t)
	wantSet(t, "an unclaimed id is new again", e.claim(t, tx, "c", "a"), "c")
	wantSet(t, "no ids", e.claim(t, tx))
	commit(t, tx)

	// A second transaction claiming an id the first holds uncommitted waits
	// for it, then skips it.
	first := e.begin(t)
	wantSet(t, "holder", e.claim(t, first, "x", "y"), "x", "y")
	got := make(chan map[string]struct{}, 1)
	go func() {
		tx, err := e.db.Begin(context.Background())
		if err != nil {
			got <- nil
			return
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		fresh, err := e.in.Claim(context.Background(), tx, claimsOf("y", "z"))
		if err != nil || tx.Commit(context.Background()) != nil {
			got <- nil
			return
		}
		got <- fresh
	}()
	commit(t, first)
	wantSet(t, "claim that waited for the holder", <-got, "z")
	if _, err := e.in.Claim(ctx(t), fakeTx{}, claimsOf("q")); !errors.Is(err, sink.ErrForeignTx) {
		t.Fatalf("Claim with another dialect's tx = %v; want ErrForeignTx", err)
	}
}

type fakeTx struct{}

func (fakeTx) Commit(context.Context) error   { return nil }
func (fakeTx) Rollback(context.Context) error { return nil }

// concurrentClaims: workers claim overlapping batches of neighbouring ids at
// once (the pattern that deadlocks on gap locks at REPEATABLE READ); every
// failure must be transient, and each id is new exactly once.
func concurrentClaims(t *testing.T, h Harness) {
	e := setup(t, h)
	const workers, batches, size, ids = 4, 25, 40, 300
	var mu sync.Mutex
	newCount := map[string]int{}
	transient := 0
	var firstTransient error
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for b := range batches {
				batch := make([]string, size)
				for i := range batch {
					batch[i] = fmt.Sprintf("id-%04d", (w*7+b*13+i*3)%ids)
				}
				fresh, retried, err := e.claimRetrying(batch)
				mu.Lock()
				for id := range fresh {
					newCount[id]++
				}
				transient += len(retried)
				if firstTransient == nil && len(retried) > 0 {
					firstTransient = retried[0]
				}
				mu.Unlock()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for id, n := range newCount {
		if n != 1 {
			t.Errorf("id %s was new %d times", id, n)
		}
	}
	if got := h.Count(t, e.db, e.schema, inboxTable); got != len(newCount) {
		t.Errorf("inbox holds %d rows, %d ids were new", got, len(newCount))
	}
	t.Logf("%d distinct ids claimed; %d transient failures retried (first: %v)", len(newCount), transient, firstTransient)
}

// claimRetrying claims ids in their own transaction, retrying what the
// dialect classifies as transient (returned in retried); any other failure
// is returned.
func (e *env) claimRetrying(ids []string) (fresh map[string]struct{}, retried []error, err error) {
	for {
		fresh, err := e.claimOnce(ids)
		if err == nil {
			return fresh, retried, nil
		}
		if class, _ := e.db.Classify(err); class != sink.ClassUnavailable {
			return nil, retried, fmt.Errorf("claim failed with a non-transient error (class %d): %w", class, err)
		}
		retried = append(retried, err)
	}
}

func (e *env) claimOnce(ids []string) (map[string]struct{}, error) {
	c := context.Background()
	tx, err := e.db.Begin(c)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(c) }()
	fresh, err := e.in.Claim(c, tx, claimsOf(ids...))
	if err != nil {
		return nil, err
	}
	return fresh, tx.Commit(c)
}

// deadlock provokes a real deadlock between two claims taken in opposite
// orders across statements: the database breaks it, and the error it gives
// the victim is transient (retried, never a message's fault).
func deadlock(t *testing.T, h Harness) {
	e := setup(t, h)
	t1, t2 := e.begin(t), e.begin(t)
	e.claim(t, t1, "m1")
	e.claim(t, t2, "m2")
	errc := make(chan error, 1)
	go func() {
		_, err := e.in.Claim(context.Background(), t1, claimsOf("m2"))
		if err != nil {
			_ = t1.Rollback(context.Background()) // PostgreSQL keeps a failed transaction's locks until then
		}
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // let t1 queue behind t2 (the test passes either way)
	_, err2 := e.in.Claim(ctx(t), t2, claimsOf("m1"))
	_ = t2.Rollback(ctx(t))
	err1 := <-errc
	victim := err1
	if victim == nil {
		victim = err2
	}
	if victim == nil {
		t.Fatal("neither claim failed: no deadlock was detected")
	}
	if class, _ := e.db.Classify(victim); class != sink.ClassUnavailable {
		t.Fatalf("deadlock %v classified as %d, want ClassUnavailable (transient)", victim, class)
	}
}
