package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// dropRetry is how often a deletion retries a sink database it cannot reach.
const dropRetry = 15 * time.Second

// reconcileDelete drops the tables when deletionPolicy is Delete, then lets
// the resource go. Retain adds no finalizer, so it never gets here with one.
// A deletion always completes: when the tables cannot be dropped (the spec
// no longer renders, the Secret went first, the database stays unreachable
// past --drop-timeout) they are left in place, which loses nothing, and a
// Warning event and the InboxReady condition say which tables and why.
func (r *Reconciler) reconcileDelete(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) (ctrl.Result, error) {
	key := client.ObjectKeyFromObject(idc)
	if !controllerutil.ContainsFinalizer(idc, FinalizerDropInbox) {
		r.forget(key)
		return ctrl.Result{}, nil
	}
	retained, err := r.dropInbox(ctx, idc)
	if err != nil {
		waited := r.opts.Clock.Since(idc.DeletionTimestamp.Time)
		if waited < r.opts.DropTimeout {
			r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, "InboxUnavailable", "DropInbox",
				"dropping the inbox tables failed, retrying for %s more: %s", (r.opts.DropTimeout - waited).Round(time.Second), errtext.Of(err))
			log.FromContext(ctx).Info("dropping the inbox tables failed; retrying", "error", err.Error())
			return ctrl.Result{RequeueAfter: min(dropRetry, r.opts.DropTimeout-waited)}, nil
		}
		retained = fmt.Sprintf("the sink database could not be reached for %s (%s)", r.opts.DropTimeout, errtext.Of(err))
	}
	if retained != "" {
		msg := fmt.Sprintf("the inbox tables of %s were left in place (deletionPolicy: Delete): %s; drop them by hand if they are no longer needed",
			inboxNameOf(idc), retained)
		r.recorder.Eventf(idc, nil, corev1.EventTypeWarning, messagingv1alpha1.ReasonInboxRetained, "DropInbox", "%s", msg)
		before := idc.DeepCopy()
		meta.SetStatusCondition(&idc.Status.Conditions, metav1.Condition{Type: messagingv1alpha1.ConditionInboxReady,
			Status: metav1.ConditionFalse, Reason: messagingv1alpha1.ReasonInboxRetained, Message: msg, ObservedGeneration: idc.Generation})
		if err := r.client.Status().Patch(ctx, idc, client.MergeFrom(before)); err != nil {
			log.FromContext(ctx).Info("could not record the retained inbox in status", "error", err.Error())
		}
	}
	patch := client.MergeFrom(idc.DeepCopy())
	controllerutil.RemoveFinalizer(idc, FinalizerDropInbox)
	if err := r.client.Patch(ctx, idc, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("removing the finalizer: %w", err)
	}
	r.forget(key)
	return ctrl.Result{}, nil
}

// inboxNameOf names the inbox table from the spec alone (it may not render).
func inboxNameOf(idc *messagingv1alpha1.IdempotentConsumer) string {
	return idc.Spec.Sink.Schema() + "." + string(idc.Spec.Sink.Inbox.Table)
}

// dropInbox drops the tables of a resource with deletionPolicy Delete. It
// returns why the tables were left in place ("" when dropped, or when
// nothing was there to drop), or an error to retry:
//   - the spec no longer renders (after an upgrade, say): what to drop is
//     not known for sure;
//   - the Secret went first (deleting a namespace deletes it too): the
//     tables cannot be found;
//   - the database itself is gone (SQLSTATE 3D000): no tables are left;
//   - the inbox records another owner (or none): dropping it would destroy
//     another resource's dedup state (inbox.ErrNotOwner);
//   - the inbox's meta table does not mark the tables as the operator's
//     (inbox.ErrNotOperatorInbox): they are someone else's.
func (r *Reconciler) dropInbox(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) (string, error) {
	rc, err := renderConfig(idc)
	if err != nil {
		return "the spec no longer renders: " + err.Error(), nil
	}
	secrets, err := r.resolveSecrets(ctx, idc, rc)
	var se *secretError
	if errors.As(err, &se) {
		return se.message, nil
	}
	if err != nil {
		return "", err
	}
	claim, err := r.ownerClaim(ctx, idc)
	if err != nil {
		return "", err
	}
	s := &scope{idc: idc, key: client.ObjectKeyFromObject(idc), rc: rc, secrets: secrets, claim: claim}
	if err := r.opts.Sink.Drop(ctx, s.target()); err != nil {
		if errors.Is(err, inbox.ErrNotOperatorInbox) || errors.Is(err, inbox.ErrNotOwner) {
			// Not ours to drop: refused for good, the resource goes.
			return "refusing to drop them: " + errtext.Of(err), nil
		}
		if sinkdb.IsDatabaseGone(err) {
			r.recorder.Eventf(idc, nil, corev1.EventTypeNormal, "InboxDropped", "DropInbox",
				"the database of %s.%s no longer exists: nothing to drop", rc.Config.Sink.Schema, rc.Config.Sink.InboxTable)
			return "", nil
		}
		_, msg := classifyDBError(idc, err)
		return "", errors.New(msg)
	}
	r.recorder.Eventf(idc, nil, corev1.EventTypeNormal, "InboxDropped", "DropInbox", "dropped the inbox tables of %s.%s (deletionPolicy: Delete)", rc.Config.Sink.Schema, rc.Config.Sink.InboxTable)
	return "", nil
}
