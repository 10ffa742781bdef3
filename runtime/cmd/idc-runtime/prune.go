package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// partitionDaysAhead: the prune job also creates today's partition and the
// next three days', so a runtime that cannot create them (or is scaled to
// zero) still finds them.
const partitionDaysAhead = 4

// Where the window in force came from.
const (
	windowFromDerived    = "derived"
	windowFromController = "controller"
)

// errRefused marks a prune that deleted nothing because no safe window is
// known.
var errRefused = errors.New("refusing to prune: no safe retention window is known; nothing was deleted")

// windowChoice is the window a prune run uses and why.
type windowChoice struct {
	window     time.Duration
	from       string
	derived    time.Duration
	controller time.Duration
}

func pruneCommand(args []string, stderr io.Writer) int {
	var flags commonFlags
	var controllerWindow time.Duration
	fs := flag.NewFlagSet("prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flags.register(fs)
	fs.DurationVar(&controllerWindow, "window", 0, "the window the controller has in force; the larger of it and the re-derived one is used")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	cfg, log, err := flags.setup("prune", stderr)
	if err != nil {
		return report(log, err)
	}
	if controllerWindow < 0 {
		return report(log, withCode(exitUsage, fmt.Errorf("--window must not be negative, got %s", controllerWindow)))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return report(log, prune(ctx, cfg, log, controllerWindow))
}

// chooseWindow applies the rule of DESIGN.md section 6: never delete below
// the larger of the job's own derivation and the controller's window. An
// unbounded replay forbids pruning whatever the controller says; a failed
// derivation falls back to the controller's window, and with neither there
// is nothing safe to use.
func chooseWindow(derived retention.Result, deriveErr error, controller time.Duration) (windowChoice, error) {
	c := windowChoice{controller: controller}
	if errors.Is(deriveErr, retention.ErrUnboundedReplay) {
		return c, fmt.Errorf("%w: %w", errRefused, deriveErr)
	}
	if deriveErr == nil {
		c.derived = derived.Window
	}
	switch {
	case c.derived <= 0 && controller <= 0:
		cause := deriveErr
		if cause == nil {
			cause = errors.New("the derivation returned no window")
		}
		return c, fmt.Errorf("%w: re-deriving failed and no --window was given: %w", errRefused, cause)
	case c.derived >= controller:
		c.window, c.from = c.derived, windowFromDerived
	default:
		c.window, c.from = controller, windowFromController
	}
	return c, nil
}

func prune(ctx context.Context, cfg *config.Config, log logr.Logger, controllerWindow time.Duration) error {
	derived, deriveErr := retention.Derive(ctx, cfg, os.Getenv, time.Now())
	if deriveErr != nil && !errors.Is(deriveErr, retention.ErrUnboundedReplay) {
		log.Error(deriveErr, "Re-deriving the retention window failed; falling back to the controller's window",
			"controllerWindow", controllerWindow.String())
	}
	choice, err := chooseWindow(derived, deriveErr, controllerWindow)
	if err != nil {
		return withCode(exitRefused, err)
	}
	pool, err := newPool(cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := inbox.New(pool, cfg.Sink)
	if err != nil {
		return withCode(exitUsage, err)
	}
	version, err := store.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if version == 0 {
		// The prune job never creates the inbox: that is the controller's
		// and the runtime's job, and there is nothing to delete yet.
		log.Info("Inbox not provisioned yet; nothing to prune", "inbox", store.QualifiedInbox())
		return nil
	}
	res, err := pruneStore(ctx, store, cfg.Retention, choice.window)
	log.Info("Prune finished",
		"inbox", store.QualifiedInbox(), "layout", string(store.Layout()),
		"cutoff", res.Cutoff, "rowsDeleted", res.RowsDeleted, "partitionsDropped", res.PartitionsDropped,
		"window", choice.window.String(), "windowSource", choice.from,
		"derivedWindow", choice.derived.String(), "controllerWindow", choice.controller.String(),
		"derivedFrom", derived.DerivedFrom, "failed", err != nil)
	if err != nil || version < 3 {
		return err // schema version 3 added the outbox
	}
	// Sent outbox rows follow the inbox window; unsent ones stay.
	sent, err := store.PruneOutbox(ctx, choice.window, cfg.Retention.PruneBatchSize, cfg.Retention.PruneMaxDuration.Duration)
	log.Info("Outbox pruned", "outboxRowsDeleted", sent, "window", choice.window.String(), "failed", err != nil)
	return err
}

func pruneStore(ctx context.Context, store *inbox.Store, r config.Retention, window time.Duration) (inbox.PruneResult, error) {
	if store.Layout() != config.LayoutPartitioned {
		return store.PruneTable(ctx, window, r.PruneBatchSize, r.PruneMaxDuration.Duration)
	}
	if err := store.EnsurePartitions(ctx, time.Now(), partitionDaysAhead); err != nil {
		return inbox.PruneResult{}, fmt.Errorf("while creating inbox partitions ahead: %w", err)
	}
	return store.PrunePartitions(ctx, window)
}
