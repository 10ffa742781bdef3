package v1alpha1

// SinkKind names the database a SinkSpec configures. Its values are the
// runtime config's sink.kind.
type SinkKind string

const (
	// SinkKindPostgres is spec.sink.postgres.
	SinkKindPostgres SinkKind = "postgres"
	// SinkKindMySQL is spec.sink.mysql (MySQL or MariaDB).
	SinkKindMySQL SinkKind = "mysql"
)

// DefaultPostgresSchema is the schema of a postgres sink that names none
// (the CRD's default; a typed client may leave it empty).
const DefaultPostgresSchema = "public"

// The accessors below are how code reads the sink's database: only they
// look into spec.sink.postgres and spec.sink.mysql, so that every reader
// works for both. Admission guarantees exactly one block is set; on a spec
// with neither (an object built in Go and never admitted) they read as an
// empty postgres sink.

// Kind is the sink's database: mysql when spec.sink.mysql is set, else
// postgres.
func (s *SinkSpec) Kind() SinkKind {
	if s.MySQL != nil {
		return SinkKindMySQL
	}
	return SinkKindPostgres
}

// ConnectionSecretRef is the Secret key holding the DSN: a PostgreSQL
// connection string, or a go-sql-driver/mysql DSN for mysql.
func (s *SinkSpec) ConnectionSecretRef() SecretKeyRef {
	switch {
	case s.MySQL != nil:
		return s.MySQL.ConnectionSecretRef
	case s.Postgres != nil:
		return s.Postgres.ConnectionSecretRef
	}
	return SecretKeyRef{}
}

// Schema is where the inbox's tables live: the PostgreSQL schema
// (DefaultPostgresSchema when empty), or the MySQL database. It is the
// runtime config's sink.schema for both.
func (s *SinkSpec) Schema() string {
	if s.MySQL != nil {
		return string(s.MySQL.Database)
	}
	if s.Postgres == nil || s.Postgres.Schema == "" {
		return DefaultPostgresSchema
	}
	return string(s.Postgres.Schema)
}

// MaxIdentifier is the longest table or column name the sink's database
// keeps: 64 characters on MySQL, 63 on PostgreSQL.
func (s *SinkSpec) MaxIdentifier() int {
	if s.Kind() == SinkKindMySQL {
		return 64
	}
	return 63
}
