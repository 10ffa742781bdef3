package jetstream

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

func convert(m jetstream.Msg) (source.Message, error) {
	msg, _, err := convertMeta(m)
	return msg, err
}

func convertMeta(m jetstream.Msg) (source.Message, *jetstream.MsgMetadata, error) {
	md, err := m.Metadata()
	if err != nil {
		return source.Message{}, nil, fmt.Errorf("while reading JetStream message metadata: %w", err)
	}
	var headers map[string]string // nil (readable) when there are none
	if h := m.Headers(); len(h) > 0 {
		headers = make(map[string]string, len(h))
		for k, v := range h {
			if len(v) > 0 {
				headers[k] = v[0]
			}
		}
	}
	return source.Message{
		NativeID:    md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10),
		Headers:     headers,
		Body:        m.Data(),
		PublishedAt: md.Timestamp,
		Attempt:     int(md.NumDelivered),
		Ref:         m,
	}, md, nil
}
