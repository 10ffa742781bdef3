package controllers

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// dropInbox drops the tables of a resource with deletionPolicy Delete. It
// returns nil when the resource may go: the tables are dropped, or there is
// nothing it could drop. Two cases found on the real node would otherwise
// hold the finalizer forever and with it the namespace's deletion:
//   - the Secret went first (deleting a namespace deletes it too): the
//     tables cannot be found, so they are left in place, which loses
//     nothing, and a Warning event says so;
//   - the database itself is gone (SQLSTATE 3D000): no tables are left.
//
// A database that is only unreachable is retried.
func (r *Reconciler) dropInbox(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) error {
	rc, err := renderConfig(idc)
	if err != nil {
		return err
	}
	// A resource that lost a conflict never owned the tables: dropping them
	// would destroy the winner's inbox.
	if c := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionStalled); c != nil && c.Status == metav1.ConditionTrue && c.Reason == messagingv1alpha1.ReasonConflict {
		return nil
	}
	secrets, err := r.resolveSecrets(ctx, idc, rc)
	var se *secretError
	if errors.As(err, &se) {
		r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, "InboxRetained", "DropInbox",
			"the inbox tables of %s.%s were left in place (deletionPolicy: Delete): %s", rc.Config.Sink.Schema, rc.Config.Sink.InboxTable, se.message)
		return nil
	}
	if err != nil {
		return err
	}
	if err := r.opts.Inbox.Drop(ctx, secrets.getenv(envPostgresDSN), rc.Config.Sink); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "3D000" {
			r.recorder.Eventf(idc, nil, corev1.EventTypeNormal, "InboxDropped", "DropInbox",
				"the database of %s.%s no longer exists: nothing to drop", rc.Config.Sink.Schema, rc.Config.Sink.InboxTable)
			return nil
		}
		_, msg := classifyDBError(err, idc.Spec.Sink.Postgres.ConnectionSecretRef)
		return errors.New(msg)
	}
	r.recorder.Eventf(idc, nil, corev1.EventTypeNormal, "InboxDropped", "DropInbox", "dropped the inbox tables of %s.%s (deletionPolicy: Delete)", rc.Config.Sink.Schema, rc.Config.Sink.InboxTable)
	return nil
}
