package v1alpha1

// SinkSpec is the sink database (PostgreSQL, or MySQL/MariaDB), the inbox in
// it and the effect to apply. Exactly one of postgres, mysql is set, and it
// cannot be switched to the other on an existing resource.
// +kubebuilder:validation:XValidation:rule="has(self.postgres) != has(self.mysql)",message="exactly one of postgres, mysql must be set"
// +kubebuilder:validation:XValidation:rule="has(self.postgres) == has(oldSelf.postgres)",message="the sink database cannot be switched between postgres and mysql: the inbox in the new database would forget every processed id, and messages redelivered or replayed would be applied again; create a new resource instead"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || size(self.inbox.table) <= 63",message="table must be at most 63 characters on PostgreSQL",fieldPath=".inbox.table"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || !has(self.effect.upsert) || size(self.effect.upsert.table) <= 63",message="table must be at most 63 characters on PostgreSQL",fieldPath=".effect.upsert.table"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || !has(self.effect.upsert) || self.effect.upsert.key.all(k, size(k) <= 63)",message="key columns must be at most 63 characters on PostgreSQL",fieldPath=".effect.upsert.key"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || !has(self.effect.upsert) || !has(self.effect.upsert.sequenceColumn) || size(self.effect.upsert.sequenceColumn) <= 63",message="sequenceColumn must be at most 63 characters on PostgreSQL",fieldPath=".effect.upsert.sequenceColumn"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || !has(self.effect.upsert) || self.effect.upsert.columns.all(k, size(k) <= 63)",message="column names must be at most 63 characters on PostgreSQL",fieldPath=".effect.upsert.columns"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || !has(self.effect.append) || size(self.effect.append.table) <= 63",message="table must be at most 63 characters on PostgreSQL",fieldPath=".effect.append.table"
// +kubebuilder:validation:XValidation:rule="!has(self.postgres) || !has(self.effect.append) || self.effect.append.columns.all(k, size(k) <= 63)",message="column names must be at most 63 characters on PostgreSQL",fieldPath=".effect.append.columns"
// +kubebuilder:validation:XValidation:rule=`!has(self.mysql) || !has(self.effect.sql) || !self.effect.sql.statement.findAll('(?s)\'([^\'\\\\]|\\\\.|\'\')*\'|"([^"\\\\]|\\\\.|"")*"|\\x60([^\\x60]|\\x60\\x60)*\\x60|#[^\\n]*(\\n|$)|--(\\n|[\\x00-\\x09\\x0b- ][^\\n]*(\\n|$)|$)|/\\*.*?\\*/|\\?').exists(t, t == '?')`,message="a positional ? parameter is not supported on MySQL: name every parameter (:name) and map it in params",fieldPath=".effect.sql.statement"
// +kubebuilder:validation:XValidation:rule=`!has(self.postgres) || !has(self.effect.sql) || !self.effect.sql.statement.matches('^([^;\'"]|\'[^\']*\'|"[^"]*")*;\\s*[^;\\s]')`,message="statement must hold exactly one command (no ';' followed by another statement)",fieldPath=".effect.sql.statement"
// +kubebuilder:validation:XValidation:rule=`!has(self.mysql) || !has(self.effect.sql) || !self.effect.sql.statement.findAll('(?s)\'([^\'\\\\]|\\\\.|\'\')*\'|"([^"\\\\]|\\\\.|"")*"|\\x60([^\\x60]|\\x60\\x60)*\\x60|#[^\\n]*(\\n|$)|--(\\n|[\\x00-\\x09\\x0b- ][^\\n]*(\\n|$)|$)|/\\*.*?\\*/|;(\\s|;|#[^\\n]*(\\n|$)|--(\\n|[\\x00-\\x09\\x0b- ][^\\n]*(\\n|$)|$)|/\\*.*?\\*/)*([^\\s;#/-]|/([^*]|$)|-([^-]|$)|--[^\\x00- ])').exists(t, t.startsWith(';'))`,message="statement must hold exactly one command (no ';' followed by another statement)",fieldPath=".effect.sql.statement"
type SinkSpec struct {
	// postgres is the PostgreSQL database. Exactly one of postgres, mysql
	// is set.
	// +optional
	Postgres *PostgresSpec `json:"postgres,omitempty"`
	// mysql is the MySQL or MariaDB database. Exactly one of postgres,
	// mysql is set. Identifiers (tables, columns) may then be 64
	// characters long (63 on PostgreSQL), and the sql effect's statement
	// follows MySQL's syntax with :name parameters.
	// +optional
	MySQL *MySQLSpec `json:"mysql,omitempty"`
	// inbox is the table of processed message ids.
	// +required
	Inbox InboxSpec `json:"inbox"`
	// effect is applied for every new message, in the same transaction as the
	// inbox claim (except http). Exactly one block is set.
	// +required
	Effect EffectSpec `json:"effect"`
}

// PostgresSpec is a PostgreSQL connection.
type PostgresSpec struct {
	// connectionSecretRef holds a PostgreSQL DSN (postgres://user:pass@host/db
	// or key=value form).
	// +required
	ConnectionSecretRef SecretKeyRef `json:"connectionSecretRef"`
	// schema holding the inbox, dead-letter and prune-run tables; created if
	// missing. Immutable. At most 63 characters.
	// +kubebuilder:default=public
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="schema is immutable"
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('pg_') && self != 'information_schema'",message="schema must not be a system schema (pg_catalog, information_schema, pg_*)"
	// +kubebuilder:validation:XValidation:rule="size(self) <= 63",message="schema must be at most 63 characters on PostgreSQL"
	// +optional
	Schema SQLIdentifier `json:"schema,omitempty"`
}

// MySQLSpec is a MySQL or MariaDB connection.
type MySQLSpec struct {
	// connectionSecretRef holds a go-sql-driver/mysql DSN,
	// user:password@tcp(host:3306)/db (options after ?, e.g. tls=true). The
	// database in the DSN is only where the connection starts: every table
	// is qualified with database below. The runtime sets its own session
	// options (READ COMMITTED, strict sql_mode, time_zone UTC).
	// +required
	ConnectionSecretRef SecretKeyRef `json:"connectionSecretRef"`
	// database holding the inbox, dead-letter, prune-run and the other
	// <inbox>_* tables, and the effect's table. It must exist (the
	// operator creates tables in it, never the database). Immutable: a new
	// database would forget every processed id. 1 to 64 characters of
	// [a-z0-9_] starting with a letter or _, not a system database (mysql,
	// information_schema, performance_schema, sys).
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="database is immutable"
	// +kubebuilder:validation:XValidation:rule="!(self in ['mysql', 'information_schema', 'performance_schema', 'sys'])",message="database must not be a system database (mysql, information_schema, performance_schema, sys)"
	// +required
	Database SQLIdentifier `json:"database"`
}

// InboxLayout is the physical layout of the inbox table.
// +kubebuilder:validation:Enum=Table;Partitioned
type InboxLayout string

const (
	// InboxLayoutTable is one table; prune deletes in bounded batches.
	InboxLayoutTable InboxLayout = "Table"
	// InboxLayoutPartitioned is partitioned per day of publish time; prune
	// drops whole partitions.
	InboxLayoutPartitioned InboxLayout = "Partitioned"
)

// DeletionPolicy says what happens to the tables when the resource is deleted.
// +kubebuilder:validation:Enum=Retain;Delete
type DeletionPolicy string

const (
	// DeletionPolicyRetain keeps the tables (default).
	DeletionPolicyRetain DeletionPolicy = "Retain"
	// DeletionPolicyDelete drops the inbox, dead-letter and prune-run tables.
	DeletionPolicyDelete DeletionPolicy = "Delete"
)

// InboxSpec is the inbox table.
type InboxSpec struct {
	// table name of the inbox. Immutable: a new table would forget every
	// processed id. The operator also creates <table>_* tables (dead letters,
	// prune runs, redrives, id conflicts, outbox, meta, progress, window and
	// the daily partitions; on MySQL also claim locks and outbox shards;
	// names over 63 characters, 64 on MySQL, are shortened with a hash), so
	// the effect and dead-letter tables may not take a name of that family,
	// the default dead-letter table excepted.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="table is immutable"
	// +required
	Table SQLIdentifier `json:"table"`
	// layout is Table (default) or Partitioned (daily partitions on publish
	// time, pruned by dropping partitions).
	// +kubebuilder:default=Table
	// +optional
	Layout InboxLayout `json:"layout,omitempty"`
	// deletionPolicy is Retain (default: the tables stay when the resource is
	// deleted) or Delete (the tables are dropped).
	// +kubebuilder:default=Retain
	// +optional
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`
}

// EffectSpec is the effect applied for each new message. Exactly one is set.
// +kubebuilder:validation:XValidation:rule="[has(self.upsert), has(self.append), has(self.sql), has(self.http)].filter(x, x).size() == 1",message="exactly one of upsert, append, sql, http must be set"
type EffectSpec struct {
	// upsert writes the latest state per key, gated by sequence.
	// +optional
	Upsert *UpsertEffect `json:"upsert,omitempty"`
	// append inserts one row per new message.
	// +optional
	Append *AppendEffect `json:"append,omitempty"`
	// sql runs a statement per new message with :name parameters bound.
	// +optional
	SQL *SQLEffect `json:"sql,omitempty"`
	// http calls an endpoint per new message with an Idempotency-Key header.
	// The guarantee is then AtLeastOnceWithIdempotencyKey.
	// +optional
	HTTP *HTTPEffect `json:"http,omitempty"`
}

// Columns maps column names to value expressions.
// +kubebuilder:validation:MinProperties=1
// +kubebuilder:validation:MaxProperties=64
// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z_][a-z0-9_]{0,63}$'))",message="column names must match ^[a-z_][a-z0-9_]{0,63}$ (at most 63 characters on PostgreSQL)"
type Columns map[string]ValueExpression

// UpsertEffect writes the latest state per key.
// +kubebuilder:validation:XValidation:rule="self.key.all(k, k in self.columns)",message="every key column must be among columns"
// +kubebuilder:validation:XValidation:rule="!has(self.sequenceColumn) || self.sequenceColumn in self.columns",message="sequenceColumn must be among columns"
type UpsertEffect struct {
	// table to upsert into. It must exist with a unique constraint on key.
	// +required
	Table SQLIdentifier `json:"table"`
	// key columns: the conflict target.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +required
	Key []SQLIdentifier `json:"key"`
	// columns to write, each from a value expression.
	// +required
	Columns Columns `json:"columns"`
	// sequenceColumn holds the entity sequence: a row is only overwritten by a
	// higher one (the sequence gate). Defaults to the column whose expression
	// is message.entity.sequence.
	// +optional
	SequenceColumn SQLIdentifier `json:"sequenceColumn,omitempty"`
}

// AppendEffect inserts one row per new message.
type AppendEffect struct {
	// table to insert into.
	// +required
	Table SQLIdentifier `json:"table"`
	// columns to write, each from a value expression.
	// +required
	Columns Columns `json:"columns"`
}

// SQLEffect runs a statement per new message.
type SQLEffect struct {
	// statement with :name parameters, e.g.
	// "UPDATE accounts SET balance = balance + :amount WHERE id = :id".
	// Values are bound as parameters, never concatenated. One command only
	// (a ';' outside quotes followed by more text is refused). On MySQL the
	// statement is read as MySQL does: '…' and "…" strings with backslash
	// escapes, `…` identifiers, and #, "-- " and /* */ comments (a ';'
	// followed only by comments is one command); a positional ? outside
	// those is refused.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=8192
	// +required
	Statement string `json:"statement"`
	// params maps parameter names to value expressions.
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[a-z_][a-z0-9_]{0,62}$'))",message="parameter names must match ^[a-z_][a-z0-9_]{0,62}$"
	// +optional
	Params map[string]ValueExpression `json:"params,omitempty"`
}

// HTTPMethod is the method of the http effect.
// +kubebuilder:validation:Enum=POST;PUT;PATCH
type HTTPMethod string

// HTTPEffect calls an endpoint with the payload and Idempotency-Key: <id>.
type HTTPEffect struct {
	// url to call.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[^ /]+')",message="url must be an http:// or https:// URL"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@')",message="url must not carry credentials (user info); use a Secret"
	// +required
	URL string `json:"url"`
	// method is POST (default), PUT or PATCH.
	// +kubebuilder:default=POST
	// +optional
	Method HTTPMethod `json:"method,omitempty"`
	// timeout of one call.
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="timeout must be positive"
	// +optional
	Timeout Duration `json:"timeout,omitempty"`
	// delivery is when the endpoint is called. Inline (default): the
	// consumer calls it for each new message and acks only after the call
	// succeeded and the id was claimed, so a slow endpoint slows
	// consumption. Outbox: the claim and an outbox row commit together and
	// the message is acked at once; the runtime's dispatcher then calls the
	// endpoint from <inbox>_outbox, keys in parallel and one key's messages
	// in order, with backoff, and dead-letters a call after
	// delivery.maxAttempts counted failures (a 4xx other than 408/429 at
	// once). Both send Idempotency-Key: <message id>: the endpoint must
	// dedupe on it.
	// +kubebuilder:default=Inline
	// +optional
	Delivery HTTPDelivery `json:"delivery,omitempty"`
}

// HTTPDelivery is when the http effect calls its endpoint.
// +kubebuilder:validation:Enum=Inline;Outbox
type HTTPDelivery string

// Values of HTTPDelivery.
const (
	HTTPDeliveryInline HTTPDelivery = "Inline"
	HTTPDeliveryOutbox HTTPDelivery = "Outbox"
)

// DeliverySpec tunes batching and retries.
type DeliverySpec struct {
	// batchSize is the most messages claimed and applied in one transaction.
	// +kubebuilder:default=500
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	BatchSize int32 `json:"batchSize,omitempty"`
	// maxWait is the longest a fetch waits when nothing is waiting on the
	// broker (batching: Adaptive), or for a batch to fill (batching: Fixed).
	// +kubebuilder:default="200ms"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="maxWait must be positive"
	// +optional
	MaxWait Duration `json:"maxWait,omitempty"`
	// maxAttempts before a message that keeps failing is dead-lettered.
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxAttempts int32 `json:"maxAttempts,omitempty"`
	// inFlight is how many transactions one replica runs at once, each on its
	// own database connection. Messages are split into lanes by entity key
	// (else message id), so two transactions in flight never touch the same
	// key and the order per key is kept; the next batch is fetched while these
	// commit. Broker-side consumer limits the runtime creates (JetStream
	// MaxAckPending, RabbitMQ prefetch) are sized to replicas x batchSize x
	// inFlight with headroom.
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	// +optional
	InFlight int32 `json:"inFlight,omitempty"`
	// batching says when a fetch that finds less than a batch returns.
	// Adaptive (default): what is waiting is processed at once, and when
	// nothing is, the first message to arrive is; under backlog batches
	// still fill to batchSize, so the same settings give a low delay at low
	// load and full throughput at high load. Fixed: when nothing is waiting,
	// a fetch waits up to maxWait for a whole batch (fewer, larger
	// transactions at low load, at the cost of up to maxWait of delay).
	// +kubebuilder:default=Adaptive
	// +optional
	Batching Batching `json:"batching,omitempty"`
	// backoff between attempts (exponential with jitter).
	// +kubebuilder:default={}
	// +optional
	Backoff BackoffSpec `json:"backoff,omitempty"`
	// deadLetter is where messages that cannot be applied are kept.
	// +optional
	DeadLetter *DeadLetterSpec `json:"deadLetter,omitempty"`
}

// Batching is Adaptive or Fixed (see DeliverySpec.Batching).
// +kubebuilder:validation:Enum=Adaptive;Fixed
type Batching string

// Values of Batching.
const (
	BatchingAdaptive Batching = "Adaptive"
	BatchingFixed    Batching = "Fixed"
)

// BackoffSpec is an exponential backoff.
// +kubebuilder:validation:XValidation:rule="!has(self.initial) || !has(self.max) || duration(self.max) >= duration(self.initial)",message="backoff.max must not be smaller than backoff.initial"
type BackoffSpec struct {
	// initial delay.
	// +kubebuilder:default="500ms"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="initial must be positive"
	// +optional
	Initial Duration `json:"initial,omitempty"`
	// max delay.
	// +kubebuilder:default="1m"
	// +optional
	Max Duration `json:"max,omitempty"`
}

// DeadLetterSpec names the dead-letter table.
type DeadLetterSpec struct {
	// table for dead letters. Defaults to <inbox table>_dead_letters.
	// +required
	Table SQLIdentifier `json:"table"`
}

// RetentionMode says where the window comes from.
// +kubebuilder:validation:Enum=Derived;Explicit
type RetentionMode string

const (
	// RetentionModeDerived derives the window from the broker's settings.
	RetentionModeDerived RetentionMode = "Derived"
	// RetentionModeExplicit uses spec.retention.window.
	RetentionModeExplicit RetentionMode = "Explicit"
)

// RetentionSpec decides how long processed ids are kept.
// +kubebuilder:validation:XValidation:rule="!has(self.mode) || self.mode != 'Explicit' || has(self.window)",message="window is required when mode is Explicit",fieldPath=".window"
// +kubebuilder:validation:XValidation:rule="(has(self.mode) && self.mode == 'Explicit') || !has(self.window)",message="window may only be set when mode is Explicit",fieldPath=".window"
type RetentionSpec struct {
	// mode is Derived (default: from the broker's redelivery and replay
	// settings, read live) or Explicit (window).
	// +kubebuilder:default=Derived
	// +optional
	Mode RetentionMode `json:"mode,omitempty"`
	// window is the retention when mode is Explicit.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="window must be positive"
	// +optional
	Window Duration `json:"window,omitempty"`
	// maxConsumerOutage is the longest the consumers may be down: attempt
	// counters do not move meanwhile, so it extends the redelivery horizon.
	// +kubebuilder:default="24h"
	// +optional
	MaxConsumerOutage Duration `json:"maxConsumerOutage,omitempty"`
	// safetyMargin is added to the derived window.
	// +kubebuilder:default="1h"
	// +optional
	SafetyMargin Duration `json:"safetyMargin,omitempty"`
	// maxReplayAge bounds replay when the broker's is unbounded (compacted
	// topic, MaxAge=0, untrimmed stream). Without it nothing is pruned.
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="maxReplayAge must be positive"
	// +optional
	MaxReplayAge Duration `json:"maxReplayAge,omitempty"`
	// prune configures the prune CronJob.
	// +kubebuilder:default={}
	// +optional
	Prune PruneSpec `json:"prune,omitempty"`
}

// PruneSpec configures the prune CronJob.
type PruneSpec struct {
	// schedule in cron format: five fields (minute 0-59, hour 0-23, day of
	// month 1-31, month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT), each a
	// list of *, ?, values (at most four digits) or ascending ranges with an
	// optional positive /step, the fields separated by single spaces; or
	// @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually.
	// Whatever passes, the CronJob API accepts as well.
	// +kubebuilder:default="*/30 * * * *"
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^@(hourly|daily|midnight|weekly|monthly|yearly|annually)$') || self.matches('^[^ ]+( [^ ]+){4}$')",message="schedule must be a five-field cron expression or a @macro"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[^ ]+( [^ ]+){4}$') || (self.split(' ')[0].matches('^([*?]|[0-9]{1,4}(-[0-9]{1,4})?)(/[0-9]{1,4})?(,([*?]|[0-9]{1,4}(-[0-9]{1,4})?)(/[0-9]{1,4})?)*$') && self.split(' ')[1].matches('^([*?]|[0-9]{1,4}(-[0-9]{1,4})?)(/[0-9]{1,4})?(,([*?]|[0-9]{1,4}(-[0-9]{1,4})?)(/[0-9]{1,4})?)*$') && self.split(' ')[2].matches('^([*?]|[0-9]{1,4}(-[0-9]{1,4})?)(/[0-9]{1,4})?(,([*?]|[0-9]{1,4}(-[0-9]{1,4})?)(/[0-9]{1,4})?)*$') && self.split(' ')[3].matches('(?i)^([*?]|([0-9]{1,4}|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)(-([0-9]{1,4}|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))?)(/[0-9]{1,4})?(,([*?]|([0-9]{1,4}|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)(-([0-9]{1,4}|jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))?)(/[0-9]{1,4})?)*$') && self.split(' ')[4].matches('(?i)^([*?]|([0-9]{1,4}|sun|mon|tue|wed|thu|fri|sat)(-([0-9]{1,4}|sun|mon|tue|wed|thu|fri|sat))?)(/[0-9]{1,4})?(,([*?]|([0-9]{1,4}|sun|mon|tue|wed|thu|fri|sat)(-([0-9]{1,4}|sun|mon|tue|wed|thu|fri|sat))?)(/[0-9]{1,4})?)*$') && [0, 1, 2, 3, 4].all(i, [self.split(' ')[0], self.split(' ')[1], self.split(' ')[2], self.split(' ')[3].lowerAscii().replace('jan', '1').replace('feb', '2').replace('mar', '3').replace('apr', '4').replace('may', '5').replace('jun', '6').replace('jul', '7').replace('aug', '8').replace('sep', '9').replace('oct', '10').replace('nov', '11').replace('dec', '12'), self.split(' ')[4].lowerAscii().replace('sun', '0').replace('mon', '1').replace('tue', '2').replace('wed', '3').replace('thu', '4').replace('fri', '5').replace('sat', '6')][i].split(',').all(e, (!e.contains('/') || int(e.split('/', 2)[1]) > 0) && (e.split('/', 2)[0] == '*' || e.split('/', 2)[0] == '?' || (e.split('/', 2)[0].split('-', 2).all(p, int(p) >= [0, 0, 1, 1, 0][i] && int(p) <= [59, 23, 31, 12, 6][i]) && int(e.split('/', 2)[0].split('-', 2)[0]) <= int(e.split('/', 2)[0].split('-', 2)[size(e.split('/', 2)[0].split('-', 2)) - 1]))))))",message="schedule must be valid cron: each field a list of *, ?, values or ascending ranges with an optional positive /step, within minute 0-59, hour 0-23, day of month 1-31, month 1-12 or JAN-DEC, day of week 0-6 or SUN-SAT"
	// +optional
	Schedule string `json:"schedule,omitempty"`
	// batchSize of each DELETE (Table layout).
	// +kubebuilder:default=10000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	BatchSize int32 `json:"batchSize,omitempty"`
	// maxDuration of one prune run.
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) > duration('0s')",message="maxDuration must be positive"
	// +optional
	MaxDuration Duration `json:"maxDuration,omitempty"`
	// suspend stops pruning.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
}
