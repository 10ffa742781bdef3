package controllers

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

func TestOutboxStatus(t *testing.T) {
	got := outboxStatus(inbox.OutboxStats{Pending: 3, OldestAge: 90*time.Second + 400*time.Millisecond})
	if got.Pending != 3 || got.OldestAge != (metav1.Duration{Duration: 90 * time.Second}) {
		t.Errorf("outboxStatus = %+v, want 3 pending, 1m30s", got)
	}
}
