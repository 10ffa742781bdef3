package consumer

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

// deadLettersTotal sums idc_dead_letters_total over every reason (each
// reason's series exists from the start, at 0).
func deadLettersTotal(t *testing.T, m *Metrics) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, len(DeadLetterReasons)+1)
	m.DeadLetters.Collect(ch)
	close(ch)
	sum := 0.0
	for metric := range ch {
		var pb dto.Metric
		if err := metric.Write(&pb); err != nil {
			t.Fatal(err)
		}
		sum += pb.GetCounter().GetValue()
	}
	return sum
}

func TestEveryDeadLetterReasonIsExportedFromTheStart(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan prometheus.Metric, 2*len(DeadLetterReasons))
	m.DeadLetters.Collect(ch)
	close(ch)
	if n := len(ch); n != len(DeadLetterReasons) {
		t.Fatalf("%d idc_dead_letters_total series before any dead letter, want %d (one per reason at 0)", n, len(DeadLetterReasons))
	}
	if got := deadLettersTotal(t, m); got != 0 {
		t.Fatalf("sum = %v, want 0", got)
	}
}

// The reason classes the metric knows are the ones redrive accepts.
func TestDeadLetterReasonsAreTheRedriveClasses(t *testing.T) {
	got, want := slices.Sorted(slices.Values(DeadLetterReasons)), slices.Sorted(slices.Values(inbox.DeadLetterClasses))
	if !slices.Equal(got, want) {
		t.Errorf("idc_dead_letters_total reasons %v, redrive classes %v: they must be the same set", got, want)
	}
}
