package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// orderStatuses name the versions of an order, in order.
var orderStatuses = []string{"created", "paid", "packed", "shipped", "delivered", "closed"}

// OrderEvent is the payload of the scenario's messages.
type OrderEvent struct {
	OrderID string `json:"orderId"`
	Version int    `json:"version"`
	Status  string `json:"status"`
}

// Message is one publish: the Nats-Msg-Id header ("" for none) and body.
type Message struct {
	ID   string
	Body []byte
}

// Workload is the scenario's stream of order events: every version of every
// order once (some versions swapped, so the sequence gate has stale updates
// to refuse), immediate producer retries (JetStream's own window drops
// them), later re-sends of a share of the events (the inbox must skip them),
// and two poison messages (no id; a body that is not JSON).
type Workload struct {
	Originals []Message
	// RetryAfter marks originals re-sent at once, as a producer retry.
	RetryAfter map[int]bool
	Resends    []Message
	Poison     []Message
	// UniqueIDs are the ids of the valid events; Latest is each order's
	// final state.
	UniqueIDs []string
	Latest    map[string]OrderEvent
	// Swapped counts orders whose versions are published out of order.
	Swapped int
	// KeyedSubjects publishes each event to <subject>.<orderId> (poison to
	// <subject>.poison), so a stream can partition by the key's token;
	// else every message goes to <subject>.events.
	KeyedSubjects bool
}

// NewWorkload builds the messages for orders x versions events; resendShare
// of them are re-sent later.
func NewWorkload(orders, versions int, resendShare float64, seed uint64) *Workload {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	w := &Workload{RetryAfter: map[int]bool{}, Latest: map[string]OrderEvent{}}
	queues := make([][]OrderEvent, orders)
	for o := range queues {
		id := fmt.Sprintf("order-%04d", o+1)
		for v := 1; v <= versions; v++ {
			queues[o] = append(queues[o], OrderEvent{OrderID: id, Version: v, Status: orderStatuses[(v-1)%len(orderStatuses)]})
		}
		w.Latest[id] = queues[o][versions-1]
		if versions > 1 && rng.IntN(3) == 0 {
			i := rng.IntN(versions - 1)
			queues[o][i], queues[o][i+1] = queues[o][i+1], queues[o][i]
			w.Swapped++
		}
	}
	w.Originals = interleave(queues, rng)
	for i, m := range w.Originals {
		w.UniqueIDs = append(w.UniqueIDs, m.ID)
		if rng.IntN(20) == 0 {
			w.RetryAfter[i] = true
		}
	}
	for _, i := range rng.Perm(len(w.Originals))[:int(float64(len(w.Originals))*resendShare)] {
		w.Resends = append(w.Resends, w.Originals[i])
	}
	w.Poison = []Message{
		{ID: "", Body: []byte(`{"orderId":"order-0001","version":99,"status":"no message id"}`)},
		{ID: "poison-not-json", Body: []byte(`{"orderId": "order-0001", "version": `)},
	}
	return w
}

// interleave draws the orders' queues in a random global order, keeping
// each order's own order.
func interleave(queues [][]OrderEvent, rng *rand.Rand) []Message {
	var out []Message
	left := len(queues)
	for left > 0 {
		o := rng.IntN(len(queues))
		if len(queues[o]) == 0 {
			continue
		}
		e := queues[o][0]
		queues[o] = queues[o][1:]
		if len(queues[o]) == 0 {
			left--
		}
		body, _ := json.Marshal(e) // a flat struct always marshals
		out = append(out, Message{ID: fmt.Sprintf("%s-v%d", e.OrderID, e.Version), Body: body})
	}
	return out
}

// PublishStats counts what was sent and what JetStream stored.
type PublishStats struct {
	Published int
	Stored    int
	// DroppedByBroker were refused by JetStream's own duplicate window.
	DroppedByBroker int
	Retries         int
	Resent          int
	Poison          int
}

// Publish sends the workload in three phases (originals with producer
// retries; after the broker's duplicate window, the re-sends; the poison
// messages). progress, when set, is called after every phase and every
// batch of 50 messages.
func (w *Workload) Publish(ctx context.Context, js jetstream.JetStream, subject string, progress func(phase string, s PublishStats)) (PublishStats, error) {
	var s PublishStats
	report := func(phase string) {
		if progress != nil {
			progress(phase, s)
		}
	}
	for i, m := range w.Originals {
		if err := w.publish(ctx, js, subject, m, &s); err != nil {
			return s, err
		}
		if w.RetryAfter[i] {
			s.Retries++
			if err := w.publish(ctx, js, subject, m, &s); err != nil {
				return s, err
			}
		}
		if (i+1)%50 == 0 && i+1 < len(w.Originals) {
			report("originals")
		}
	}
	report("originals")
	// Past the broker's window, a re-sent id is stored again, as a
	// redelivery or a replay would be delivered again.
	time.Sleep(2 * StreamDuplicateWindow)
	for i, m := range w.Resends {
		s.Resent++
		if err := w.publish(ctx, js, subject, m, &s); err != nil {
			return s, err
		}
		if (i+1)%50 == 0 && i+1 < len(w.Resends) {
			report("re-sends")
		}
	}
	report("re-sends")
	for _, m := range w.Poison {
		s.Poison++
		if err := w.publish(ctx, js, subject, m, &s); err != nil {
			return s, err
		}
	}
	report("poison")
	return s, nil
}

func (w *Workload) publish(ctx context.Context, js jetstream.JetStream, subject string, m Message, s *PublishStats) error {
	msg := nats.NewMsg(subject + ".events")
	if w.KeyedSubjects {
		var e OrderEvent
		if json.Unmarshal(m.Body, &e) == nil && e.OrderID != "" {
			msg.Subject = subject + "." + e.OrderID
		} else {
			msg.Subject = subject + ".poison"
		}
	}
	if m.ID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, m.ID)
	}
	msg.Data = m.Body
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return fmt.Errorf("publishing %q: %w", m.ID, err)
	}
	s.Published++
	if ack.Duplicate {
		s.DroppedByBroker++
	} else {
		s.Stored++
	}
	return nil
}

// Outcome is what the database holds after the consumer drained.
type Outcome struct {
	// InboxRows is how many of the unique ids the inbox holds (each once:
	// it is the primary key).
	InboxRows      int
	UniqueIDs      int
	Orders         int
	OrdersAtLatest int
	DeadLetterRows int
	// Mismatches describe projection rows that differ from the final state.
	Mismatches []string
}

// OK says whether every id took effect exactly once and the projection is
// each order's latest version.
func (o Outcome) OK() bool {
	return o.InboxRows == o.UniqueIDs && o.OrdersAtLatest == o.Orders && len(o.Mismatches) == 0
}

// Verify reads the inbox, the projection and the dead letters.
func (w *Workload) Verify(ctx context.Context, dsn string, idc *messagingv1alpha1.IdempotentConsumer) (Outcome, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return Outcome{}, fmt.Errorf("connecting to the sink database: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	schema := idc.Spec.Sink.Schema()
	inboxTable := string(idc.Spec.Sink.Inbox.Table)
	deadLetters := inbox.DerivedName(inboxTable, "_dead_letters")
	if dl := idc.Spec.Delivery.DeadLetter; dl != nil {
		deadLetters = string(dl.Table)
	}
	o := Outcome{UniqueIDs: len(w.UniqueIDs), Orders: len(w.Latest)}
	q := "SELECT count(*) FROM " + pgx.Identifier{schema, inboxTable}.Sanitize() + " WHERE message_id = ANY($1)"
	if err := conn.QueryRow(ctx, q, w.UniqueIDs).Scan(&o.InboxRows); err != nil {
		return o, fmt.Errorf("counting inbox rows: %w", err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, deadLetters}.Sanitize()).Scan(&o.DeadLetterRows); err != nil {
		return o, fmt.Errorf("counting dead letters: %w", err)
	}
	return o, w.verifyProjection(ctx, conn, pgx.Identifier{schema, string(idc.Spec.Sink.Effect.Upsert.Table)}, &o)
}

func (w *Workload) verifyProjection(ctx context.Context, conn *pgx.Conn, table pgx.Identifier, o *Outcome) error {
	rows, err := conn.Query(ctx, "SELECT order_id, status, version FROM "+table.Sanitize())
	if err != nil {
		return fmt.Errorf("reading the projection: %w", err)
	}
	defer rows.Close()
	return w.checkProjection(func(e *OrderEvent) (bool, error) {
		if !rows.Next() {
			return false, rows.Err()
		}
		var version int64
		if err := rows.Scan(&e.OrderID, &e.Status, &version); err != nil {
			return false, err
		}
		e.Version = int(version)
		return true, nil
	}, o)
}

// checkProjection compares the projection's rows, read one at a time by
// next (false at the end), with each order's final state.
func (w *Workload) checkProjection(next func(*OrderEvent) (bool, error), o *Outcome) error {
	seen := 0
	for {
		var e OrderEvent
		ok, err := next(&e)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		seen++
		want, ok := w.Latest[e.OrderID]
		if ok && want == e {
			o.OrdersAtLatest++
			continue
		}
		o.Mismatches = append(o.Mismatches, fmt.Sprintf("%s at version %d (%s), want %d (%s)", e.OrderID, e.Version, e.Status, want.Version, want.Status))
	}
	if seen != len(w.Latest) {
		o.Mismatches = append(o.Mismatches, fmt.Sprintf("%d rows in the projection, want %d", seen, len(w.Latest)))
	}
	return nil
}
