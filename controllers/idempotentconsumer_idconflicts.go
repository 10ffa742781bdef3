package controllers

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// IDConflictCounter counts the id conflicts an inbox kept; PostgresInbox
// implements it. An InboxClient without it reports none.
type IDConflictCounter interface {
	IDConflicts(ctx context.Context, dsn string, sink config.Sink) (int64, error)
}

// IDConflicts implements IDConflictCounter.
func (p *PostgresInbox) IDConflicts(ctx context.Context, dsn string, sink config.Sink) (int64, error) {
	var n int64
	err := p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error {
		var err error
		n, err = s.ConflictCount(ctx)
		return err
	})
	return n, err
}

// reportIDConflicts adds a non-zero count of id conflicts (a producer that
// reuses message ids for different payloads) to the InboxReady message. It
// never changes the condition's status: the effect stayed exactly once; the
// producer needs fixing.
func (r *Reconciler) reportIDConflicts(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secrets *resolvedSecrets, obs *observation) {
	counter, ok := r.opts.Inbox.(IDConflictCounter)
	if !ok || !obs.inbox.ok {
		return
	}
	n, err := counter.IDConflicts(ctx, secrets.getenv(envPostgresDSN), rc.Config.Sink)
	if err != nil {
		_, msg := classifyDBError(err, idc.Spec.Sink.Postgres.ConnectionSecretRef)
		log.FromContext(ctx).Info("could not count id conflicts", "reason", msg)
		return
	}
	if n > 0 {
		names := inbox.NamesFor(rc.Config.Sink)
		obs.inbox.message += fmt.Sprintf("; %d id conflicts: the producer reused message ids for different payloads (rows in %s.%s, or dead letters with reason class id_conflict; message.id.onPayloadMismatch)",
			n, names.Schema, names.IDConflicts)
	}
}
