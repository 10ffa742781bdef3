package controllers

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/log"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// readLastPrune copies the latest prune run recorded in the database into
// status.lastPrune. It is informational: a failure is logged, not fatal.
func (r *Reconciler) readLastPrune(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig, secrets *resolvedSecrets) {
	run, err := r.opts.Inbox.LastPrune(ctx, secrets.getenv(envPostgresDSN), rc.Config.Sink)
	if err != nil {
		_, msg := classifyDBError(err, idc.Spec.Sink.Postgres.ConnectionSecretRef)
		log.FromContext(ctx).Info("could not read the last prune run", "reason", msg)
		return
	}
	idc.Status.LastPrune = lastPruneStatus(run)
}

// lastPruneStatus is status.lastPrune for a recorded run; runs still going
// or never run leave it empty.
func lastPruneStatus(run *inbox.PruneRun) *messagingv1alpha1.PruneRunStatus {
	if run == nil || run.FinishedAt == nil {
		return nil
	}
	finished := metav1.NewTime(run.FinishedAt.UTC())
	cutoff := metav1.NewTime(run.Cutoff.UTC())
	return &messagingv1alpha1.PruneRunStatus{
		Time: &finished, Cutoff: &cutoff, RowsDeleted: run.RowsDeleted, PartitionsDropped: int32(run.PartitionsDropped),
	}
}

func unstructuredOf(obj map[string]any, gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(gvk)
	// Fields the server owns must not be part of an apply request.
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u
}
