package config

// Extractor reads one value from a message: exactly one field is set.
type Extractor struct {
	Header       string `json:"header,omitempty"`
	JSONPath     string `json:"jsonPath,omitempty"`
	BrokerNative bool   `json:"brokerNative,omitempty"`
}

func (e Extractor) count() int {
	n := 0
	if e.Header != "" {
		n++
	}
	if e.JSONPath != "" {
		n++
	}
	if e.BrokerNative {
		n++
	}
	return n
}

// Message says where the dedup id and the optional entity key/sequence are.
type Message struct {
	ID Extractor `json:"id"`
	// OnPayloadMismatch is what a duplicate id with a different payload
	// fingerprint (a producer reusing an id) does: Record (default),
	// DeadLetter or Ignore. It is counted in idc_id_conflicts_total in every
	// case.
	OnPayloadMismatch string  `json:"onPayloadMismatch,omitempty"`
	Entity            *Entity `json:"entity,omitempty"`
}

// Values of Message.OnPayloadMismatch.
const (
	PayloadMismatchRecord     = "Record"
	PayloadMismatchDeadLetter = "DeadLetter"
	PayloadMismatchIgnore     = "Ignore"
)

// Entity turns on the sequence gate.
type Entity struct {
	Key      Extractor `json:"key"`
	Sequence Extractor `json:"sequence"`
}
