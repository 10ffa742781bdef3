package controllers

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
)

func TestLagBuckets(t *testing.T) {
	for n, want := range map[int64]int{-1: 0, 0: 0, 1: 1, 9: 1, 10: 2, 99: 2, 100: 3, 999: 3, 1000: 4, 1 << 62: 19} {
		if got := lagBucket(n); got != want {
			t.Errorf("lagBucket(%d) = %d, want %d", n, got, want)
		}
	}
}

// status.lag is rewritten only when a broker read moves the backlog into
// another power-of-ten bucket: a backlog that moves within one (every read
// while traffic flows) issues no status write, while the manager's
// idc_resource_lag_messages gauge follows every read.
func TestStatusLagIsWrittenOnlyAcrossABucket(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	h.markAvailable()
	if idc, _ := h.pass(); idc.Status.Lag == nil || *idc.Status.Lag != 7 {
		t.Fatalf("status.lag = %v after the first read of 7", idc.Status.Lag)
	}
	gauge := resourceLag.WithLabelValues("shop", "orders")
	for _, step := range []struct {
		read, status int64
		writes       int
	}{
		{8, 7, 0}, {9, 7, 0}, {1, 7, 0}, // 1-9
		{10, 10, 1}, {57, 10, 0}, {99, 10, 0}, // 10-99
		{100, 100, 1}, {4321, 4321, 1}, {9999, 4321, 0}, // 100-999, 1000-9999
		{3, 3, 1}, {0, 0, 1}, {0, 0, 0}, // drained
	} {
		h.broker.mu.Lock()
		h.broker.lag = &step.read
		h.broker.mu.Unlock()
		h.clk.Step(fakePeriod + time.Minute) // the next periodic read
		before, _ := h.counts()
		idc, _ := h.pass()
		after, _ := h.counts()
		if idc.Status.Lag == nil || *idc.Status.Lag != step.status {
			t.Errorf("read %d: status.lag = %v, want %d", step.read, idc.Status.Lag, step.status)
		}
		if after-before != step.writes {
			t.Errorf("read %d (status.lag %d): %d status writes, want %d", step.read, step.status, after-before, step.writes)
		}
		if got := testutil.ToFloat64(gauge); got != float64(step.read) {
			t.Errorf("read %d: idc_resource_lag_messages = %v", step.read, got)
		}
	}
	// Other tests' resources have series too: forget drops this one only.
	before := testutil.CollectAndCount(resourceLag, "idc_resource_lag_messages")
	forgetResourceSeries(types.NamespacedName{Namespace: "shop", Name: "orders"})
	if after := testutil.CollectAndCount(resourceLag, "idc_resource_lag_messages"); after != before-1 {
		t.Errorf("%d lag series before forget, %d after; want one less", before, after)
	}
}
