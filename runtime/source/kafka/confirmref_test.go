package kafka

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/source"
)

// What the consumer keeps of a record while its offset awaits a commit is
// its position, not its value, and ConfirmAcks reads either alike.
func TestConfirmRefKeepsThePositionOnly(t *testing.T) {
	s := &Source{committed: map[topicPartition]int64{{"orders", 0}: 11}}
	rec := &kgo.Record{Topic: "orders", Partition: 0, Offset: 10, Value: make([]byte, 1<<20)}
	kept := s.ConfirmRef(source.Message{NativeID: "orders/0/10", Ref: rec})
	if _, ok := kept.(recordAt); !ok {
		t.Fatalf("ConfirmRef kept %T, want the record's position", kept)
	}
	later := &kgo.Record{Topic: "orders", Partition: 0, Offset: 11}
	ok, err := s.ConfirmAcks(context.Background(), [][]source.Message{
		{{Ref: kept}}, {{Ref: rec}}, {{Ref: s.ConfirmRef(source.Message{Ref: later})}},
	})
	if err != nil || !ok[0] || !ok[1] || ok[2] {
		t.Fatalf("ConfirmAcks = %v, %v; want the kept and the whole record confirmed below the commit (11), the record at it not", ok, err)
	}
}
