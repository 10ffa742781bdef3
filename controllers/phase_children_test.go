package controllers

import (
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

func TestPruneSuspension(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "db")
	idc.Spec.Retention.Prune.Schedule = "*/30 * * * *"
	idc.Spec.Retention.Prune.MaxDuration = "10m"
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if cj := specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", 0); !*cj.Spec.Suspend {
		t.Error("an unresolved window must suspend the CronJob")
	}
	cj := specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", 49*time.Hour)
	if *cj.Spec.Suspend {
		t.Error("a resolved window must schedule the CronJob")
	}
	if got := cj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args; got[len(got)-1] != "49h0m0s" {
		t.Errorf("args %v do not end with the window", got)
	}
	idc.Spec.Retention.Prune.Suspend = true
	if cj := specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", 49*time.Hour); !*cj.Spec.Suspend {
		t.Error("prune.suspend must suspend the CronJob")
	}
}
