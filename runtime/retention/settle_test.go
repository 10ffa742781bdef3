package retention

// Settle against the live services (and franz-go's in-process kfake cluster
// for Kafka): a consumer is handed some messages, acknowledges only some,
// and the settlement must say what can still come back.

import (
	"maps"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	settlePublished = 10
	settleConsumed  = 6
	settleAcked     = 4
)

func mustSettle(t *testing.T, cfg *config.Config, getenv Getenv) Settlement {
	t.Helper()
	s, err := Settle(testCtx(t), cfg, getenv)
	if err != nil {
		t.Fatalf("Settle: %v", err)
	}
	t.Logf("settlement: unsettled=%d position=%v floor=%v facts=%q", s.Unsettled, s.Position, s.Floor, s.Facts)
	return s
}

// wantSettlement fails unless s has exactly these numbers.
func wantSettlement(t *testing.T, s Settlement, unsettled int64, position, floor map[string]int64) {
	t.Helper()
	if s.Unsettled != unsettled || !maps.Equal(s.Position, position) || !maps.Equal(s.Floor, floor) {
		t.Fatalf("settlement unsettled=%d position=%v floor=%v; want unsettled=%d position=%v floor=%v (%s)",
			s.Unsettled, s.Position, s.Floor, unsettled, position, floor, s.Facts)
	}
}

func TestSettlePassed(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Settlement
		mark map[string]int64
		want bool
	}{
		{"nil mark: nothing to wait for", Settlement{Unsettled: 3, Floor: map[string]int64{"stream": 1}}, nil, true},
		{"key missing from Floor", Settlement{Unsettled: 3, Floor: map[string]int64{"t/0": 9}}, map[string]int64{"t/1": 1}, false},
		{"nil Floor", Settlement{Unsettled: 3}, map[string]int64{"stream": 0}, false},
		{"nothing unsettled", Settlement{Unsettled: 0, Floor: map[string]int64{"stream": 1}}, map[string]int64{"stream": 100, "other": 5}, true},
		{"floor equals mark", Settlement{Unsettled: 2, Floor: map[string]int64{"stream": 6}}, map[string]int64{"stream": 6}, true},
		{"floor above mark", Settlement{Unsettled: 2, Floor: map[string]int64{"stream": 7}}, map[string]int64{"stream": 6}, true},
		{"floor below mark", Settlement{Unsettled: 2, Floor: map[string]int64{"stream": 5}}, map[string]int64{"stream": 6}, false},
		{"one key of two below", Settlement{Unsettled: 1, Floor: map[string]int64{"t/0": 10, "t/1": 2}}, map[string]int64{"t/0": 10, "t/1": 3}, false},
		{"every key passed", Settlement{Unsettled: 1, Floor: map[string]int64{"t/0": 10, "t/1": 3, "t/2": 0}}, map[string]int64{"t/0": 10, "t/1": 3}, true},
	} {
		if got := tc.s.Passed(tc.mark); got != tc.want {
			t.Errorf("%s: Passed(%v) with floor %v unsettled %d = %v, want %v", tc.name, tc.mark, tc.s.Floor, tc.s.Unsettled, got, tc.want)
		}
	}
}
