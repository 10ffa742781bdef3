package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// partitionDaysAhead: the prune job also creates today's partition and the
// next three days', so a runtime that cannot create them (or is scaled to
// zero) still finds them.
const partitionDaysAhead = 4

// Where the window in force came from.
const (
	windowFromDerived    = "derived"
	windowFromController = "controller"
	windowFromStored     = "stored"
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
	stored     time.Duration
}

func pruneCommand(args []string, stderr io.Writer) int {
	var flags commonFlags
	var controllerWindow time.Duration
	fs := flags.flagSet("prune", stderr)
	fs.DurationVar(&controllerWindow, "window", 0, "the window the controller has in force; the largest of it, the re-derived one and the one stored with the inbox is used")
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
	ctx, stop := process.SignalContext()
	defer stop()
	return report(log, prune(ctx, cfg, log, controllerWindow))
}

// chooseWindow applies the rule of DESIGN.md section 6: never delete below
// the largest of the job's own derivation, the controller's window and the
// window in force stored beside the inbox (which keeps a pending shrink
// waiting, even for a resource re-created without status). An unbounded
// replay forbids pruning whatever the others say; with none of the three
// there is nothing safe to use.
func chooseWindow(derived retention.Result, deriveErr error, controller, stored time.Duration) (windowChoice, error) {
	c := windowChoice{controller: controller, stored: stored}
	if errors.Is(deriveErr, retention.ErrUnboundedReplay) {
		return c, fmt.Errorf("%w: %w", errRefused, deriveErr)
	}
	if deriveErr == nil {
		c.derived = derived.Window
	}
	c.window, c.from = c.derived, windowFromDerived
	if controller > c.window {
		c.window, c.from = controller, windowFromController
	}
	if stored > c.window {
		c.window, c.from = stored, windowFromStored
	}
	if c.window <= 0 {
		cause := deriveErr
		if cause == nil {
			cause = errors.New("the derivation returned no window")
		}
		return c, fmt.Errorf("%w: re-deriving failed, no window is stored with the inbox and no --window was given: %w", errRefused, cause)
	}
	return c, nil
}

func prune(ctx context.Context, cfg *config.Config, log logr.Logger, controllerWindow time.Duration) error {
	derived, deriveErr := retention.Derive(ctx, cfg, os.Getenv, time.Now())
	if errors.Is(deriveErr, retention.ErrUnboundedReplay) {
		_, err := chooseWindow(derived, deriveErr, controllerWindow, 0)
		return withCode(exitRefused, err)
	}
	if deriveErr != nil {
		log.Error(deriveErr, "Re-deriving the retention window failed; falling back to the stored and the controller's window",
			"controllerWindow", controllerWindow.String())
	}
	db, store, ok, err := openSinkInbox(ctx, cfg, log)
	if err != nil || !ok {
		return errors.Join(err, ctx.Err())
	}
	defer db.Close()
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
	if err := inbox.CheckKnownVersion(store.Names(), version); err != nil {
		return withCode(exitRefused, fmt.Errorf("refusing to prune: %w", err))
	}
	if version < inbox.SchemaVersion {
		// An inbox of an older runtime: the progress records and the window
		// state need schema 5. Migrating is online and idempotent, as the
		// runtime does at start.
		log.Info("Migrating the inbox before pruning", "inbox", store.QualifiedInbox(), "from", version, "to", inbox.SchemaVersion)
		if err := store.Migrate(ctx); err != nil {
			return err
		}
	}
	if err := store.Verify(ctx); err != nil {
		// Not the inbox the controller provisioned (dropped, truncated,
		// re-created): nothing is pruned until a person accepts the loss.
		return withCode(exitRefused, fmt.Errorf("refusing to prune: %w", err))
	}
	stored, err := adoptWindow(ctx, store, derived, deriveErr)
	if err != nil {
		return err
	}
	choice, err := chooseWindow(derived, deriveErr, controllerWindow, stored)
	if err != nil {
		return withCode(exitRefused, err)
	}
	hold, cost, err := holdByProgress(ctx, cfg, store, choice.window, log)
	if err != nil {
		return err
	}
	res, err := pruneStore(ctx, store, cfg.Retention, hold.Bound(choice.window))
	kv := []any{
		"inbox", store.QualifiedInbox(), "layout", string(store.Layout()),
		"cutoff", res.Cutoff, "windowCutoff", res.WindowCutoff, "rowsDeleted", res.RowsDeleted, "partitionsDropped", res.PartitionsDropped,
		"window", choice.window.String(), "windowSource", choice.from,
		"derivedWindow", choice.derived.String(), "controllerWindow", choice.controller.String(), "storedWindow", choice.stored.String(),
		"derivedFrom", derived.DerivedFrom, "heldBack", hold.Held(),
		"progressRecords", cost.records, "brokerCalls", cost.brokerCalls, "progressCheckMs", cost.took.Milliseconds(),
		"failed", err != nil,
	}
	if hold.Held() {
		kv = append(kv, "heldFor", retention.FormatDuration(hold.HeldFor().Truncate(time.Second)),
			"heldSince", hold.Since, "heldBy", hold.Holders, "heldReason", hold.Reason)
	}
	log.Info("Prune finished", kv...)
	if err != nil {
		return err
	}
	// Sent outbox rows follow the inbox window; unsent ones stay.
	sent, err := store.PruneOutbox(ctx, choice.window, cfg.Retention.PruneBatchSize, cfg.Retention.PruneMaxDuration.Duration)
	log.Info("Outbox pruned", "outboxRowsDeleted", sent, "window", choice.window.String(), "failed", err != nil)
	return err
}

// adoptWindow runs the derivation through the window state stored beside the
// inbox (the controller adopts through the same function) and returns the
// window in force there; 0 when none is stored and nothing was derived.
func adoptWindow(ctx context.Context, store sink.Inbox, derived retention.Result, deriveErr error) (time.Duration, error) {
	var applied *retention.Applied
	var err error
	if deriveErr == nil {
		var a retention.Applied
		a, _, err = retention.AdoptStored(ctx, store, derived, time.Now())
		applied = &a
	} else {
		applied, err = retention.StoredApplied(ctx, store)
	}
	if err != nil {
		return 0, fmt.Errorf("while adopting the window stored with the inbox: %w", err)
	}
	if applied == nil {
		return 0, nil
	}
	return applied.InForce.Window, nil
}

// progressCost is what checking the consumer's progress cost this run.
type progressCost struct {
	records, brokerCalls int
	took                 time.Duration
}

// holdByProgress bounds the cutoff by the replicas' progress records
// (retention.Hold). The broker is asked only when a replica stopped
// heartbeating without a graceful stop: an idle, fully acknowledged
// consumer costs one query.
func holdByProgress(ctx context.Context, cfg *config.Config, store sink.Inbox, window time.Duration, log logr.Logger) (retention.Hold, progressCost, error) {
	start := time.Now()
	now, recs, err := store.Progress(ctx)
	if err != nil {
		return retention.Hold{}, progressCost{}, err
	}
	cost := progressCost{records: len(recs)}
	// One broker call per consumer a silent replica consumed from: cfg's
	// own, or, of a partitioned source, each partition's durable.
	readings := map[string]settleReading{}
	for _, r := range recs {
		if r.Stopped || now.Sub(r.HeartbeatAt) <= retention.StaleAfter {
			continue
		}
		key, target := settleTarget(cfg, r)
		if _, ok := readings[key]; ok {
			continue
		}
		cost.brokerCalls++
		var rd settleReading
		if rd.st, rd.err = retention.Settle(ctx, target, os.Getenv); rd.err != nil {
			log.Error(rd.err, "Cannot read what the broker could still redeliver; replicas that stopped heartbeating keep holding pruning back",
				"consumer", key)
		}
		readings[key] = rd
	}
	reading := func(r inbox.ProgressRecord) settleReading {
		key, _ := settleTarget(cfg, r)
		return readings[key]
	}
	hold := retention.BoundByReadings(now, window, recs, func(r inbox.ProgressRecord) (retention.Settlement, error) {
		rd := reading(r)
		return rd.st, rd.err
	})
	for _, r := range hold.Stamp {
		if err := store.MarkStale(ctx, r, hold.Marks[r.Replica]); err != nil && !inbox.IsProgressMoved(err) {
			return hold, cost, err
		}
		st := reading(r).st
		log.Info("Replica stopped heartbeating with claims the broker may redeliver; holding pruning back until the broker settles them",
			"progressReplica", r.Replica, "lastProgress", r.HeartbeatAt, "settleMark", st.Position, "broker", st.Facts)
	}
	for _, r := range hold.Retire {
		if err := store.RetireProgress(ctx, r); err != nil {
			return hold, cost, err
		}
		if !r.Stopped {
			log.Info("The broker settled everything a gone replica could have claimed; it no longer holds pruning back",
				"progressReplica", r.Replica, "lastProgress", r.HeartbeatAt, "broker", reading(r).st.Facts)
		}
	}
	cost.took = time.Since(start)
	return hold, cost, nil
}

// settleReading is one broker settlement reading of a prune run.
type settleReading struct {
	st  retention.Settlement
	err error
}

// settleTarget names the consumer a replica's claims came from (key) and
// the config reading its settlement (retention.Settle). Unpartitioned, it
// is cfg's consumer for every record, as it always was. Of a partitioned
// JetStream source it is the durable the record's consumer identity names
// (its partition's, "<stream>/<consumer>-p<i>"), read alone; a record
// naming none on the stream (an older runtime's) consumed from the
// configured consumer before the source was partitioned.
func settleTarget(cfg *config.Config, r inbox.ProgressRecord) (string, *config.Config) {
	j := cfg.Source.NATSJetStream
	if j == nil || !j.Partitioned() {
		return "", cfg
	}
	durable := j.Consumer
	if j.OnePartition {
		durable = strings.TrimSuffix(durable, fmt.Sprintf("-p%d", j.PartitionIndex))
	}
	if id := r.Consumer; id != nil && id.Kind == cfg.Source.Kind() {
		if name, ok := strings.CutPrefix(id.Name, j.Stream+"/"); ok && name != "" {
			durable = name
		}
	}
	one := *j
	one.Consumer, one.Partitions, one.PartitionIndex, one.OnePartition = durable, 0, 0, false
	target := *cfg
	target.Source.NATSJetStream = &one
	return j.Stream + "/" + durable, &target
}

func pruneStore(ctx context.Context, store sink.Inbox, r config.Retention, b inbox.Bound) (inbox.PruneResult, error) {
	if store.Layout() != config.LayoutPartitioned {
		return store.PruneTable(ctx, b, r.PruneBatchSize, r.PruneMaxDuration.Duration)
	}
	if err := store.EnsurePartitions(ctx, time.Now(), partitionDaysAhead); err != nil {
		return inbox.PruneResult{}, fmt.Errorf("while creating inbox partitions ahead: %w", err)
	}
	return store.PrunePartitions(ctx, b)
}
