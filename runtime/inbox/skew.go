package inbox

import (
	"errors"
	"fmt"
)

// Version skew (docs/operate.md, "Version skew"): a runtime or manager
// never writes into an inbox whose recorded schema version is newer than its
// own SchemaVersion. It does not know that shape (a column it leaves unset
// may be one the newer version relies on), so it refuses before any DDL or
// write, with a NewerSchemaError. An inbox older than SchemaVersion is
// migrated in place by whichever comes first, the controller or a runtime
// starting (Migrate is online, idempotent and serialized).

// NewerSchemaError: the inbox records a schema version newer than this
// binary's SchemaVersion.
type NewerSchemaError struct {
	Inbox    string // schema-qualified, unquoted
	Recorded int    // the meta row's schema_version
	Known    int    // this binary's SchemaVersion
}

func (e *NewerSchemaError) Error() string {
	return fmt.Sprintf("inbox %s has schema version %d, newer than the %d this binary knows: it refuses to read or write "+
		"a shape it does not know. A newer release migrated it; run that release's runtime image or a newer one "+
		"(upgrade the manager back, or fix spec.runtime.image / the manager's --runtime-image). Rolling a release back "+
		"never rolls an inbox's schema back: see docs/operate.md, \"Version skew\"",
		e.Inbox, e.Recorded, e.Known)
}

// IsNewerSchema reports whether err is (or wraps) a *NewerSchemaError.
func IsNewerSchema(err error) bool {
	var n *NewerSchemaError
	return errors.As(err, &n)
}

// CheckKnownVersion returns a *NewerSchemaError when version (as
// SchemaVersion(ctx) read it) is newer than this binary's SchemaVersion.
func (s *Store) CheckKnownVersion(version int) error { return CheckKnownVersion(s.names, version) }

// CheckKnownVersion returns a *NewerSchemaError when the recorded version of
// the inbox named n is newer than this binary's SchemaVersion (both
// dialects).
func CheckKnownVersion(n Names, version int) error {
	if version > SchemaVersion {
		return &NewerSchemaError{Inbox: n.Schema + "." + n.Inbox, Recorded: version, Known: SchemaVersion}
	}
	return nil
}
