package config

// Layout of the inbox table.
type Layout string

const (
	LayoutTable       Layout = "Table"
	LayoutPartitioned Layout = "Partitioned"
)

// SinkKind names the sink database.
type SinkKind string

const (
	SinkPostgres SinkKind = "postgres"
	SinkMySQL    SinkKind = "mysql"
)

// Sink is the sink database and the effect applied there.
type Sink struct {
	// Kind is the database: postgres ("" reads as postgres) or mysql
	// (MySQL or MariaDB; Schema then names the database).
	Kind SinkKind `json:"kind,omitempty"`
	// DSNEnv holds the connection string: a PostgreSQL one, or a
	// go-sql-driver/mysql DSN for mysql.
	DSNEnv          string `json:"dsnEnv"`
	Schema          string `json:"schema"`
	InboxTable      string `json:"inboxTable"`
	Layout          Layout `json:"layout"`
	DeadLetterTable string `json:"deadLetterTable,omitempty"`
	Effect          Effect `json:"effect"`
	// InboxEpoch is the epoch of the inbox the controller provisioned
	// (status.inbox.epoch): the runtime, its prune and redrive Jobs claim
	// into that inbox only, and hold when it is lost ("" before the
	// controller recorded one).
	InboxEpoch string `json:"inboxEpoch,omitempty"`
}

// Effect holds exactly one effect block. Column and parameter values are
// value expressions: "$.a.b" (JSON path into the payload), "@messageId",
// "@publishedAt", "@payload" (the whole payload as jsonb) or "@header:<Name>".
type Effect struct {
	Upsert *Upsert `json:"upsert,omitempty"`
	Append *Append `json:"append,omitempty"`
	SQL    *SQL    `json:"sql,omitempty"`
	HTTP   *HTTP   `json:"http,omitempty"`
}

// Kind names the configured effect.
func (e Effect) Kind() string {
	switch {
	case e.Upsert != nil:
		return "upsert"
	case e.Append != nil:
		return "append"
	case e.SQL != nil:
		return "sql"
	case e.HTTP != nil:
		return "http"
	}
	return ""
}

// Upsert writes the latest state per key, gated by SequenceColumn.
type Upsert struct {
	Table   string            `json:"table"`
	Key     []string          `json:"key"`
	Columns map[string]string `json:"columns"`
	// SequenceColumn, when set, is the sequence gate: a row is updated only
	// when the incoming value is greater than the stored one.
	SequenceColumn string `json:"sequenceColumn,omitempty"`
}

// Append inserts one row per new message.
type Append struct {
	Table   string            `json:"table"`
	Columns map[string]string `json:"columns"`
}

// SQL runs a user statement per new message with :name parameters bound.
type SQL struct {
	Statement string            `json:"statement"`
	Params    map[string]string `json:"params,omitempty"`
}

// HTTP calls a remote endpoint with an Idempotency-Key header.
type HTTP struct {
	URL     string   `json:"url"`
	Method  string   `json:"method"`
	Timeout Duration `json:"timeout"`
	// Delivery is Inline (the loop calls the endpoint, then claims and
	// acks) or Outbox (the claim and an outbox row commit together and the
	// message is acked at once; the relay's dispatcher calls the endpoint).
	Delivery string `json:"delivery,omitempty"`
	// DenyNetworks are CIDRs the effect never connects to, checked on the
	// address actually dialled (after DNS): the manager's --http-deny-networks
	// (link-local and cloud metadata addresses by default).
	DenyNetworks []string `json:"denyNetworks,omitempty"`
}

// Values of HTTP.Delivery.
const (
	HTTPInline = "Inline"
	HTTPOutbox = "Outbox"
)

// DatabaseKind is Kind with the default applied.
func (s Sink) DatabaseKind() SinkKind {
	if s.Kind == "" {
		return SinkPostgres
	}
	return s.Kind
}
