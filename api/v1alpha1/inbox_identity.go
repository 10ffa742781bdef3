package v1alpha1

// The inbox records its owner and epoch in the database (DESIGN.md section
// 9). A person says what the controller must never infer on its own with
// these annotations; each takes effect once, for the value it names.
const (
	// AnnotationAdoptInboxFrom names the recorded owner of an inbox this
	// resource may take over, as the Conflict message prints it:
	// <cluster>/<namespace>/<name>. Without it, a resource whose inbox
	// another resource owns (in any namespace, through any Secret, in any
	// cluster) is Stalled with reason Conflict. The same namespace/name in
	// the same cluster (a restore without status, an Argo CD replace)
	// adopts without it.
	AnnotationAdoptInboxFrom = "messaging.idempotency.dev/adopt-inbox-from"
	// AnnotationAcceptInboxLoss accepts that the inbox of the epoch it
	// names (status.inbox.epoch, as the InboxLost message prints it) is
	// lost, and that the consumer continues with the inbox as it is now
	// (empty, or another generation's): messages redelivered or replayed
	// from before the loss are applied again. A new epoch is recorded and
	// the consumer pods roll; the annotation then names an old epoch and
	// does nothing.
	AnnotationAcceptInboxLoss = "messaging.idempotency.dev/accept-inbox-loss"
)

const (
	// ReasonInboxLost (Stalled, InboxReady=False): the inbox that held
	// this resource's claims (status.inbox.epoch) was dropped, truncated or
	// replaced. Nothing is re-created; the runtime holds (claims and
	// acknowledges nothing) until a person sets AnnotationAcceptInboxLoss.
	ReasonInboxLost = "InboxLost"
	// ReasonInboxAdopted (event): the resource took over an inbox recorded
	// for the same name with another UID, or one named by
	// AnnotationAdoptInboxFrom.
	ReasonInboxAdopted = "InboxAdopted"
	// ReasonInboxLossAccepted (event): a person accepted a lost inbox.
	ReasonInboxLossAccepted = "InboxLossAccepted"
)
