package retention

import "errors"

var (
	// ErrUnboundedReplay: a horizon the window depends on is unbounded (a
	// compacted topic, retention.ms=-1, MaxAge=0, an untrimmed stream,
	// unbounded attempts without a TTL) and retention.maxReplayAge is not
	// declared. The controller reports reason UnboundedReplay and suspends
	// pruning; nothing may be deleted.
	ErrUnboundedReplay = errors.New("unbounded replay")

	// ErrBrokerUnreachable wraps the cause when the broker (or its
	// management API) cannot be reached or did not answer. Callers keep the
	// window they have and never shrink because of it.
	ErrBrokerUnreachable = errors.New("broker unreachable")

	// ErrSourceNotFound: the broker answered but the stream, topic or queue
	// the config names does not exist. Callers keep the window they have.
	ErrSourceNotFound = errors.New("source not found on the broker")

	// ErrNotPartitioned: natsJetStream.partitions is set but the stream
	// does not partition its subjects that way (no {{partition(N,...)}}
	// transform, another N, or a server older than 2.10). It is also
	// ErrSourceNotFound: callers keep the window they have.
	ErrNotPartitioned = errors.New("the stream is not partitioned as natsJetStream.partitions says")

	// ErrInvalidSpec: the retention settings cannot be used (negative
	// durations, Explicit mode without a window, an unknown mode).
	ErrInvalidSpec = errors.New("invalid retention settings")
)

// notPartitioned is an ErrNotPartitioned (and ErrSourceNotFound) whose
// text is its cause's: the actionable message of PartitionFilter or
// PartitionsSupported.
type notPartitioned struct{ error }

func (e notPartitioned) Is(target error) bool {
	return target == ErrNotPartitioned || target == ErrSourceNotFound
}

func (e notPartitioned) Unwrap() error { return e.error }
