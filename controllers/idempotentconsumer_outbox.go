package controllers

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// OutboxReader reads the backlog of an inbox's outbox; PostgresInbox
// implements it. An InboxClient without it leaves status.outbox empty.
type OutboxReader interface {
	OutboxStats(ctx context.Context, dsn string, sink config.Sink) (inbox.OutboxStats, error)
}

// OutboxStats implements OutboxReader.
func (p *PostgresInbox) OutboxStats(ctx context.Context, dsn string, sink config.Sink) (inbox.OutboxStats, error) {
	var st inbox.OutboxStats
	err := p.with(ctx, dsn, sink, func(ctx context.Context, s *inbox.Store) error {
		var err error
		st, err = s.OutboxStats(ctx)
		return err
	})
	return st, err
}

// readOutbox fills status.outbox for a resource with spec.emit. It is
// informational: a failure is logged and keeps the last value.
func (r *Reconciler) readOutbox(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secrets *resolvedSecrets) {
	reader, ok := r.opts.Inbox.(OutboxReader)
	if !ok || !rc.Config.UsesOutbox() {
		idc.Status.Outbox = nil
		return
	}
	st, err := reader.OutboxStats(ctx, secrets.getenv(envPostgresDSN), rc.Config.Sink)
	if err != nil {
		_, msg := classifyDBError(err, idc.Spec.Sink.Postgres.ConnectionSecretRef)
		log.FromContext(ctx).Info("could not read the outbox backlog", "reason", msg)
		return
	}
	idc.Status.Outbox = outboxStatus(st)
}

// outboxStatus is status.outbox for a backlog, the age in whole seconds.
func outboxStatus(st inbox.OutboxStats) *messagingv1alpha1.OutboxStatus {
	return &messagingv1alpha1.OutboxStatus{Pending: st.Pending, OldestAge: metav1.Duration{Duration: st.OldestAge.Truncate(time.Second)}}
}
