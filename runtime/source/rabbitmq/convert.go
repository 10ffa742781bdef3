package rabbitmq

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// convert maps a delivery to a Message (without Ref). Table headers are
// stringified; the properties message_id, correlation_id, type, content_type
// and app_id, when set, are added under those names and win over table
// headers of the same name.
func convert(d amqp.Delivery, received time.Time) source.Message {
	headers := make(map[string]string, len(d.Headers)+3)
	for k, v := range d.Headers {
		headers[k] = stringify(v)
	}
	for k, v := range map[string]string{
		"message_id":     d.MessageId,
		"correlation_id": d.CorrelationId,
		"type":           d.Type,
		"content_type":   d.ContentType,
		"app_id":         d.AppId,
	} {
		if v != "" {
			headers[k] = v
		}
	}
	published := d.Timestamp
	if published.IsZero() {
		published = received
	}
	return source.Message{
		NativeID:    d.MessageId,
		Headers:     headers,
		Body:        d.Body,
		PublishedAt: published,
		Attempt:     attempt(d),
	}
}

// attempt is x-delivery-count + 1 when the queue reports it (quorum
// queues), 1 for a delivery the broker flags as first, and 0 (unknown) for
// a redelivery without a count.
func attempt(d amqp.Delivery) int {
	if n, ok := toInt(d.Headers["x-delivery-count"]); ok {
		return n + 1
	}
	if d.Redelivered {
		return 0
	}
	return 1
}

func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int8:
		return int(n), true
	case int16:
		return int(n), true
	case int32:
		return int(n), true
	case int64:
		return int(n), true
	case uint8:
		return int(n), true
	case uint16:
		return int(n), true
	case uint32:
		return int(n), true
	}
	return 0, false
}

func stringify(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case []byte:
		return string(x)
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}
