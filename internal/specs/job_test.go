package specs

import (
	"slices"
	"testing"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func TestRedriveJobPassesReasonAndIDs(t *testing.T) {
	idc := &messagingv1alpha1.IdempotentConsumer{}
	idc.Name, idc.Namespace = "orders", "shop"
	job := RedriveJob(idc, &RuntimeConfig{}, "img", "h", "tok", "invalid_json", []string{"o-1", "o-2"})
	want := []string{"redrive", "--config", "/etc/idc/config.json", "--run", "tok", "--reason", "invalid_json", "--id", "o-1", "--id", "o-2"}
	if got := job.Spec.Template.Spec.Containers[0].Args; !slices.Equal(got, want) {
		t.Errorf("args %v, want %v", got, want)
	}
}
