package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// migrateTimeout bounds the one-shot migration (DDL waits for locks).
const migrateTimeout = 2 * time.Minute

func migrateCommand(args []string, stderr io.Writer) int {
	var flags commonFlags
	fs := flags.flagSet("migrate", stderr)
	if err := parseFlags(fs, args); err != nil {
		return exitCode(err)
	}
	cfg, log, err := flags.setup("migrate", stderr)
	if err != nil {
		return report(log, err)
	}
	return report(log, migrate(cfg, log))
}

func migrate(cfg *config.Config, log logr.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
	defer cancel()
	db, store, ok, err := openSinkInbox(ctx, cfg, log)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("while connecting to the sink database: %w", ctx.Err())
	}
	defer db.Close()
	if err := store.Migrate(ctx); err != nil {
		if inbox.IsNewerSchema(err) {
			return withCode(exitRefused, err)
		}
		return err
	}
	n := store.Names()
	log.Info("Inbox migrated", "schema", n.Schema, "inbox", n.Inbox, "deadLetters", n.DeadLetters,
		"layout", string(cfg.Sink.Layout), "schemaVersion", inbox.SchemaVersion)
	return nil
}
