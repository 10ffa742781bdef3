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

	// ErrInvalidSpec: the retention settings cannot be used (negative
	// durations, Explicit mode without a window, an unknown mode).
	ErrInvalidSpec = errors.New("invalid retention settings")
)
