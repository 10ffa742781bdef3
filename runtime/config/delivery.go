package config

// Delivery tunes batching and retries.
type Delivery struct {
	BatchSize      int      `json:"batchSize"`
	MaxWait        Duration `json:"maxWait"`
	MaxAttempts    int      `json:"maxAttempts"`
	BackoffInitial Duration `json:"backoffInitial"`
	BackoffMax     Duration `json:"backoffMax"`
	// InFlight is how many transactions one replica runs at once, each on
	// its own connection, on lanes split by entity key (else id) hash.
	InFlight int `json:"inFlight"`
	// Replicas is the declared replica count (spec.runtime.replicas). It
	// only sizes broker-side consumer limits shared by all replicas
	// (JetStream MaxAckPending); the controller leaves it out of the config
	// hash, so scaling does not roll the pods.
	Replicas int `json:"replicas,omitempty"`
	// Batching is Adaptive (the default) or Fixed: how long a fetch waits
	// when fewer than a batch of messages are waiting (see Batching).
	Batching Batching `json:"batching,omitempty"`
}

// Batching says when a fetch that finds less than a whole batch returns.
type Batching string

const (
	// BatchingAdaptive: a fetch returns what is waiting at once, and when
	// nothing is, as soon as the first message arrives; under backlog the
	// batch still fills. maxWait only bounds an idle wait.
	BatchingAdaptive Batching = "Adaptive"
	// BatchingFixed: when nothing is waiting, a fetch waits up to maxWait
	// for a whole batch (the behaviour before adaptive batching; kept for
	// side-by-side measurements and for who wants the fewest transactions).
	BatchingFixed Batching = "Fixed"
)

// Limit sizing. A JetStream replica holds at most about this many fetches
// (of batchSize x inFlight each) delivered and not yet acknowledged: the one
// its lanes commit, one queued (a batch per lane), the one being handed to
// the lanes, and the one the adapter has requested ahead. A RabbitMQ
// replica's prefetch holds the same (its buffer stands in for the request
// ahead). A broker limit below MinUnacked cannot fill the declared
// replicas' batches; one the runtime creates gets limitHeadroom times that.
const limitHeadroom = 4

// MinUnacked is the smallest broker-side limit on unacknowledged messages
// that lets every declared replica fill its in-flight batches:
// replicas x batchSize x inFlight.
func (d Delivery) MinUnacked(replicas int) int {
	return max(replicas, 1) * d.BatchSize * max(d.InFlight, 1)
}

// SizedUnacked is the limit the runtime gives a broker-side consumer it
// creates: MinUnacked with headroom, so the next batches are fetched while
// the current ones commit.
func (d Delivery) SizedUnacked(replicas int) int {
	return limitHeadroom * d.MinUnacked(replicas)
}
