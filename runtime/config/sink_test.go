package config

import (
	"strings"
	"testing"
)

// Identifiers follow the sink's database: 63 characters on PostgreSQL, 64
// on MySQL, as the CRD admits them.
func TestIdentifierLengthFollowsTheSinkKind(t *testing.T) {
	for _, tc := range []struct {
		kind    SinkKind
		n       int
		invalid bool
	}{
		{"", 63, false}, {SinkPostgres, 63, false}, {SinkPostgres, 64, true},
		{SinkMySQL, 63, false}, {SinkMySQL, 64, false}, {SinkMySQL, 65, true},
	} {
		c := emitConfig(nil)
		c.Sink.Kind = tc.kind
		name := strings.Repeat("t", tc.n)
		c.Sink.InboxTable, c.Sink.Schema = name, name
		c.Sink.Effect = Effect{Upsert: &Upsert{Table: name, Key: []string{name}, Columns: map[string]string{name: "$.a"}, SequenceColumn: name}}
		err := c.Validate()
		if tc.invalid {
			for _, field := range []string{"sink.schema", "sink.inboxTable", "sink.effect.upsert.table", "sink.effect.upsert.columns"} {
				if err == nil || !strings.Contains(err.Error(), field+": ") {
					t.Errorf("kind %q, %d characters: %v does not name %s", tc.kind, tc.n, err, field)
				}
			}
		} else if err != nil {
			t.Errorf("kind %q, %d characters: %v", tc.kind, tc.n, err)
		}
	}
}
