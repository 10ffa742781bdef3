package retention

import (
	"fmt"
	"time"
)

// rabbitObservation applies the RabbitMQ rules:
//   - classic and quorum queues: L = message-ttl (∞ without one); consumed
//     messages are gone, so R_replay = 0; a quorum queue's delivery-limit N
//     allows N+1 deliveries, each leased for consumer_timeout; classic
//     queues have no delivery limit (A = ∞);
//   - streams: consumed messages stay until max-age, so L = R_replay =
//     max-age (∞ without one); attempts are unbounded. Streams expire whole
//     segments, so a message can outlive max-age while its segment is
//     active; the safety margin has to cover that.
func rabbitObservation(q rabbitQueue, s rabbitSettings) Observation {
	facts := []string{fmt.Sprintf("queue %s vhost %s type=%s (broker)", q.Name, q.Vhost, q.Type)}
	if q.Type == "stream" {
		return rabbitStreamObservation(facts, s)
	}
	life := Infinite()
	if s.ttl.set {
		life = Finite(s.ttl.v)
		facts = append(facts, fmt.Sprintf("message-ttl=%s (%s)", FormatDuration(s.ttl.v), s.ttl.origin))
	} else {
		facts = append(facts, "no message-ttl (neither argument nor policy)")
	}
	attempts, af := rabbitAttempts(q.Type, s)
	facts = append(facts, af...)
	facts = append(facts, "consumed messages are removed: no replay beyond redelivery")
	return Observation{Life: life, Attempts: attempts, Replay: Finite(0), Facts: facts}
}

func rabbitStreamObservation(facts []string, s rabbitSettings) Observation {
	h := Infinite()
	if s.maxAge.set {
		h = Finite(s.maxAge.v)
		facts = append(facts, fmt.Sprintf("max-age=%s (%s, raw %s)", FormatDuration(s.maxAge.v), s.maxAge.origin, s.maxAgeRaw))
	} else {
		facts = append(facts, "no max-age (the stream keeps messages until its size limits evict them)")
	}
	facts = append(facts, "stream consumers re-read from an offset: attempts unbounded")
	return Observation{Life: h, Replay: h, Facts: facts}
}

// rabbitAttempts is the attempts bound and the facts behind it.
func rabbitAttempts(queueType string, s rabbitSettings) (Attempts, []string) {
	ct := s.consumerTimeout
	ctFact := "consumer_timeout disabled (" + ct.origin + ")"
	if ct.set {
		ctFact = fmt.Sprintf("consumer_timeout=%s (%s)", FormatDuration(ct.v), ct.origin)
	}
	if queueType != "quorum" {
		return Attempts{}, []string{"no delivery limit (" + queueType + " queue): attempts unbounded", ctFact}
	}
	limit, limitFact := quorumLimit(s)
	if limit < 0 || !ct.set {
		return Attempts{}, []string{limitFact, ctFact}
	}
	return Attempts{Max: int(limit) + 1, Leases: []time.Duration{ct.v}}, []string{limitFact, ctFact}
}

// quorumLimit returns the delivery limit (-1: unlimited) and its fact.
func quorumLimit(s rabbitSettings) (int64, string) {
	l := s.deliveryLimit
	switch {
	case l.set && l.v < 0:
		return -1, fmt.Sprintf("delivery-limit=%d (%s): unlimited", l.v, l.origin)
	case l.set:
		return l.v, fmt.Sprintf("delivery-limit=%d (%s): at most %d deliveries", l.v, l.origin, l.v+1)
	case s.quorumDefaultLimit > 0:
		return s.quorumDefaultLimit, fmt.Sprintf("delivery-limit=%d (RabbitMQ %s default for quorum queues)", s.quorumDefaultLimit, s.version)
	}
	return -1, fmt.Sprintf("no delivery-limit (RabbitMQ %s quorum queue): attempts unbounded", s.version)
}
