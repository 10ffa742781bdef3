package controllers

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// idConflictsPhase adds a non-zero count of id conflicts (a producer that
// reuses message ids for different payloads) to the InboxReady message. It
// never changes the condition's status: the effect stayed exactly once; the
// producer needs fixing.
func (r *Reconciler) idConflictsPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	if !s.obs.inbox.ok {
		return ctrl.Result{}, nil
	}
	n, err := r.opts.Sink.IDConflicts(ctx, s.target())
	if err != nil {
		_, msg := classifyDBError(s.idc, err)
		log.FromContext(ctx).Info("could not count id conflicts", "reason", msg)
		r.distrustSink(s)
		return ctrl.Result{}, nil
	}
	if n > 0 {
		names := inbox.NamesFor(s.rc.Config.Sink)
		s.obs.inbox.message += fmt.Sprintf("; %d id conflicts: the producer reused message ids for different payloads (rows in %s.%s, or dead letters with reason class id_conflict; message.id.onPayloadMismatch)",
			n, names.Schema, names.IDConflicts)
	}
	return ctrl.Result{}, nil
}
