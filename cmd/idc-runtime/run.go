package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idempotency-dev/idc-operator/internal/process"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/consumer"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/outbox"
	"github.com/idempotency-dev/idc-operator/runtime/server"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
	"github.com/idempotency-dev/idc-operator/runtime/source"
	"github.com/idempotency-dev/idc-operator/runtime/source/open"
)

// failpointEnv arms a crash point for chaos tests only (see the package
// comment).
const (
	failpointEnv         = "IDC_FAILPOINT"
	failpointAfterCommit = "after-commit-before-ack"
	failpointAfterRelay  = "relay-after-publish-before-mark"
	failpointBeforeRelay = "relay-before-publish"
)

// runGCPercent is the consumer's GOGC when the environment sets none. Its
// live heap is small (a few MiB: the batches in flight) and it allocates in
// proportion to the messages, so with the collector's default of 100 it ran
// a collection every few MiB, and garbage collection was the largest single
// cost per message (about a quarter of the replica's CPU at batch 500).
// 400 lets the heap grow to five times the live data between collections:
// a few tens of MiB, within the runtime container's 128Mi request; the soft
// limit under the container's limit (process.SetMemory) keeps it from an
// OOM kill.
const runGCPercent = 400

// shutdownTimeout bounds the HTTP server's shutdown after the loop stopped.
const shutdownTimeout = 5 * time.Second

func runCommand(args []string, stderr io.Writer) int {
	var flags commonFlags
	var consumerName string
	var partition int
	fs := flags.flagSet("run", stderr)
	fs.StringVar(&consumerName, "consumer-name", "", "this replica's name on the broker (default $POD_NAME, else the host name)")
	fs.IntVar(&partition, "partition", -1, "the partition this replica reads, 0..partitions-1: required when source.natsJetStream.partitions is set, refused otherwise")
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	cfg, log, err := flags.setup("run", stderr)
	if err != nil {
		return report(log, err)
	}
	if err := selectPartition(cfg, partition, flagGiven(fs, "partition")); err != nil {
		return report(log, err)
	}
	if j := cfg.Source.NATSJetStream; j != nil && j.OnePartition {
		log = log.WithValues("partition", j.PartitionIndex)
	}
	if consumerName, err = resolveConsumerName(consumerName); err != nil {
		return report(log, err)
	}
	log = log.WithValues("replica", consumerName)
	ctx, stop := process.SignalContext()
	defer stop()
	return report(log, runConsumer(ctx, cfg, log, consumerName))
}

// selectPartition makes cfg partition i's view (config.JetStream.ForPartition)
// when the source is partitioned: the replica then reads, creates and
// records (its progress row's consumer identity) the partition's durable.
// --partition is required with partitions and refused without.
func selectPartition(cfg *config.Config, i int, set bool) error {
	j := cfg.Source.NATSJetStream
	if j == nil || !j.Partitioned() {
		if set {
			return withCode(exitUsage, errors.New("--partition is set, but the source is not partitioned (source.natsJetStream.partitions is not set)"))
		}
		return nil
	}
	if !set || i < 0 || i >= j.Partitions {
		got := "not set"
		if set {
			got = fmt.Sprint(i)
		}
		return withCode(exitUsage, fmt.Errorf("--partition must be one of 0..%d: the source is read in %d partitions (source.natsJetStream.partitions), each replica reads one; got %s",
			j.Partitions-1, j.Partitions, got))
	}
	view := j.ForPartition(i)
	cfg.Source.NATSJetStream = &view
	return nil
}

// flagGiven reports whether the flag was given on the command line.
func flagGiven(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func resolveConsumerName(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if pod := os.Getenv("POD_NAME"); pod != "" {
		return pod, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", withCode(exitUsage, fmt.Errorf("while reading the host name for the consumer name (set --consumer-name or POD_NAME): %w", err))
	}
	return host, nil
}

// dieAbruptly kills the process with no deferred function, flush or
// acknowledgement run after the commit. As a container's PID 1 the kernel
// drops a signal the process sends itself, SIGKILL included, so there it
// exits at once with SIGKILL's status (137) instead.
func dieAbruptly() {
	if os.Getpid() == 1 {
		os.Exit(128 + int(syscall.SIGKILL))
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Hour) // the signal is asynchronous; never return to the ack
}

// armFailpoint wires IDC_FAILPOINT. An unknown value is an error, so a typo
// in a chaos test cannot silently disable the crash it expects.
func armFailpoint(value string, log logr.Logger) error {
	switch value {
	case "":
		return nil
	case failpointAfterCommit:
		log.Info("CHAOS FAILPOINT ARMED: the process will SIGKILL itself after the first commit, before acknowledging",
			"env", failpointEnv, "value", value)
		consumer.AfterCommitHook = dieAbruptly
		return nil
	case failpointAfterRelay:
		log.Info("CHAOS FAILPOINT ARMED: the process will SIGKILL itself after the outbox relay's first publish, before marking it sent",
			"env", failpointEnv, "value", value)
		relayAfterPublish = func() error {
			dieAbruptly() // never reach the mark-sent commit
			return nil
		}
		return nil
	case failpointBeforeRelay:
		log.Info("CHAOS FAILPOINT ARMED: the process will SIGKILL itself when the outbox relay first claimed committed events, before publishing them",
			"env", failpointEnv, "value", value)
		relayBeforePublish = func() error {
			dieAbruptly() // never reach the publish
			return nil
		}
		return nil
	}
	return withCode(exitUsage, fmt.Errorf("%s=%q is not a known failpoint (only %q, %q, %q)", failpointEnv, value,
		failpointAfterCommit, failpointBeforeRelay, failpointAfterRelay))
}

// cpuProfileEnv names a file to write a Go CPU profile to, from start to a
// graceful stop (a diagnostic: `go tool pprof idc-runtime FILE`).
const cpuProfileEnv = "IDC_CPU_PROFILE"

func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// relayAfterPublish and relayBeforePublish are the relay's failpoint hooks
// (nil unless armed).
var relayAfterPublish, relayBeforePublish func() error

// runConsumer serves the probes and metrics, gets the database and broker
// ready (retrying while either is down), and runs the loop until ctx ends.
func runConsumer(ctx context.Context, cfg *config.Config, log logr.Logger, consumerName string) error {
	if err := armFailpoint(os.Getenv(failpointEnv), log); err != nil {
		return err
	}
	mem, err := process.SetMemory(runGCPercent)
	if err != nil {
		log.Error(err, "Cannot read the container's memory limit; running without a soft memory limit")
	}
	// 0 means the environment's GOGC / GOMEMLIMIT, or no container limit.
	log.V(1).Info("Go collector", "gcPercentSet", mem.GCPercent, "softMemoryLimitSet", mem.SoftLimit)
	if path := os.Getenv(cpuProfileEnv); path != "" {
		stop, err := startCPUProfile(path)
		if err != nil {
			return withCode(exitUsage, err)
		}
		log.Info("Writing a CPU profile until the process stops", "env", cpuProfileEnv, "path", path)
		defer stop()
	}
	db, ok, err := openSink(ctx, cfg, log)
	if err != nil || !ok {
		return err
	}
	defer db.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every idc_* series carries the sink's kind (sink_kind="postgres" or
	// "mysql"): the dashboard and alerts aggregate by namespace and pod, so
	// they read both kinds unchanged, and a panel can split by it.
	idcReg := prometheus.WrapRegistererWith(prometheus.Labels{"sink_kind": string(db.Kind())}, reg)
	metrics, err := consumer.NewMetrics(idcReg)
	if err != nil {
		return err
	}
	state := newLoopState(cfg.Delivery.BackoffMax.Duration)
	ops, err := newOpsGauges(idcReg, state)
	if err != nil {
		return err
	}
	srv, err := server.Start(cfg.HealthAddr, reg, server.Checks{Live: state.live, Ready: state.ready, Sink: string(db.Kind())})
	if err != nil {
		return err
	}
	log.Info("Serving metrics and health", "address", srv.Addr())
	defer shutdownServer(srv, log)

	// The server failing stops the loop gracefully; its error is returned.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		if err := <-srv.Err(); err != nil {
			cancel(err)
		}
	}()
	// Registered without spec.emit too (at 0), so dashboards and the
	// IdcOutboxStuck alert read one metric set on every replica.
	relayMetrics, err := outbox.NewMetrics(idcReg)
	if err != nil {
		return err
	}
	if err := consume(ctx, cfg, log, consumerName, db, metrics, relayMetrics, state, ops); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("Stopped gracefully")
	return nil
}

func consume(ctx context.Context, cfg *config.Config, log logr.Logger, consumerName string, db sink.DB, metrics *consumer.Metrics, relayMetrics *outbox.Metrics, state *loopState, ops *opsGauges) (err error) {
	// The outbox relay failing stops the loop (and the process) with its
	// error.
	ctx, stopLoop := context.WithCancelCause(ctx)
	defer stopLoop(nil)
	store, err := sink.InboxFor(db, cfg)
	if err != nil {
		return withCode(exitUsage, err)
	}
	// Built before anything is dialled, so a config the loop cannot run
	// fails at once instead of after the database and broker are up.
	watched := &watchedSource{state: state}
	c, err := consumer.New(watched, db, cfg, metrics, log)
	if err != nil {
		return withCode(exitUsage, fmt.Errorf("while building the consumer: %w", err))
	}
	c.SetReplica(consumerName)
	state.consumer.Store(c)
	// Migrating here makes a pod work even before the controller provisioned
	// the inbox; it is idempotent. It never re-creates the inbox of the
	// epoch the config names once that is lost: the consumer then holds
	// (inbox_lost) until a person accepts the loss.
	// An inbox a newer release migrated is refused at once (exit 3), never
	// retried: this binary does not know its shape (inbox.NewerSchemaError).
	var newer error
	if _, ok := retry(ctx, log, "migrate inbox", cfg.Delivery, func(ctx context.Context) (struct{}, error) {
		err := store.Migrate(ctx)
		if inbox.IsNewerSchema(err) {
			newer = err
			return struct{}{}, nil
		}
		if inbox.IsLost(err) {
			log.Error(err, "The inbox this consumer deduplicates against is lost; holding: nothing is claimed or acknowledged until it is back or the loss is accepted on the IdempotentConsumer")
			return struct{}{}, nil
		}
		return struct{}{}, err
	}); !ok {
		return nil
	}
	if newer != nil {
		return withCode(exitRefused, newer)
	}
	src, ok := retry(ctx, log, "open source", cfg.Delivery, func(ctx context.Context) (source.Source, error) {
		return open.Open(ctx, cfg, log, consumerName)
	})
	if !ok {
		return nil
	}
	// The last progress record is written once the source is closed (its
	// Close sends the last acks), whichever way consume returns.
	defer func() {
		closeErr := src.Close()
		if closeErr != nil {
			log.Error(closeErr, "Closing the source failed")
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		// A Close that failed may have lost acks: then the stop is not
		// recorded as graceful.
		if err := c.FinishProgress(fctx, closeErr == nil); err != nil {
			log.Error(err, "Could not record this replica's graceful stop; pruning holds back from its last record until the broker shows its claims settled")
		}
	}()
	watched.Source = src
	state.touch()
	go ops.refresh(ctx, cfg, store, log)
	if cfg.UsesOutbox() {
		relay, ok := openRelay(ctx, cfg, log, db, store, relayMetrics)
		if ok {
			relay.DeadLettered = func(class string) { metrics.DeadLetters.WithLabelValues(class).Inc() }
		}
		if !ok {
			return nil
		}
		defer relay.Publisher.Close()
		// Joined before the publisher closes and before the source closes
		// and the last progress record is written (the defers above).
		join := startRelay(ctx, relay.Run, stopLoop)
		defer func() {
			if relayErr := join(); relayErr != nil {
				log.Error(relayErr, "Outbox relay stopped")
				if err == nil {
					err = relayErr
				}
			}
		}()
	}
	log.Info("Consuming", "source", cfg.Source.Kind(), "effect", cfg.Sink.Effect.Kind(),
		"inbox", store.QualifiedInbox(), "layout", string(cfg.Sink.Layout))
	if err := c.Run(ctx); err != nil {
		return fmt.Errorf("while consuming: %w", err)
	}
	return nil
}

// startRelay runs the relay in a goroutine on a context of its own. join
// stops it (cancels that context), waits until it returned and gives its
// error; a relay that fails on its own cancels the loop first (stopLoop),
// so the loop ends and the process exits with that error.
func startRelay(ctx context.Context, run func(context.Context) error, stopLoop context.CancelCauseFunc) (join func() error) {
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		err := run(ctx)
		if err != nil {
			err = fmt.Errorf("outbox relay: %w", err)
			stopLoop(err)
		}
		done <- err
	}()
	return sync.OnceValue(func() error {
		stop()
		return <-done
	})
}

func shutdownServer(srv *server.Server, log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Error(err, "Shutting the metrics and health server down failed")
	}
}

// openRelay connects the emit target (retrying while it is down) and builds
// this replica's outbox relay. It reports false when ctx ended first.
func openRelay(ctx context.Context, cfg *config.Config, log logr.Logger, db sink.DB, store sink.Inbox, metrics *outbox.Metrics) (*outbox.Relay, bool) {
	d := cfg.Delivery
	relay := &outbox.Relay{
		Store: store, DB: db, Metrics: metrics, Log: log.WithName("outbox"),
		BatchSize: d.BatchSize, Workers: d.InFlight, Poll: d.MaxWait.Duration,
		BackoffInitial: d.BackoffInitial.Duration, BackoffMax: d.BackoffMax.Duration,
		AfterPublish: relayAfterPublish, BeforePublish: relayBeforePublish,
	}
	if cfg.Emit == nil {
		// The http effect with delivery: Outbox: the dispatcher calls the
		// endpoint, giving up (a dead letter, class http) after
		// maxAttempts counted failures, as the inline effect does.
		pub, err := outbox.NewHTTPDispatcher(cfg.Sink.Effect.HTTP)
		if err != nil {
			log.Error(err, "Cannot build the http dispatcher")
			return nil, false
		}
		relay.Publisher, relay.MaxAttempts, relay.DeadLetterClass = pub, d.MaxAttempts, outbox.HTTPDeadLetterClass
		relay.Log = log.WithName("dispatcher")
		return relay, true
	}
	pub, ok := retry(ctx, log, "open emit target", cfg.Delivery, func(context.Context) (outbox.Publisher, error) {
		return outbox.NewPublisher(cfg.Emit)
	})
	if !ok {
		return nil, false
	}
	relay.Publisher = pub
	return relay, true
}
