package controllers

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

func TestBrokerLimitsCondition(t *testing.T) {
	jetStream := func(replicas int32) *messagingv1alpha1.IdempotentConsumer {
		idc := newConsumer("orders", "ORDERS", "orders-db")
		idc.Spec.Runtime.Replicas = ptr.To(replicas)
		idc.Spec.Delivery.BatchSize = 500
		idc.Spec.Delivery.InFlight = 2
		return idc
	}
	rabbit := func(prefetch *int32) *messagingv1alpha1.IdempotentConsumer {
		idc := jetStream(2)
		idc.Spec.Source = messagingv1alpha1.SourceSpec{RabbitMQ: &messagingv1alpha1.RabbitMQSource{
			URISecretRef: messagingv1alpha1.SecretKeyRef{Name: "amqp", Key: "uri"}, Queue: "orders", Prefetch: prefetch,
		}}
		return idc
	}
	for _, tc := range []struct {
		name     string
		idc      *messagingv1alpha1.IdempotentConsumer
		limits   retention.ConsumerLimits
		status   metav1.ConditionStatus
		contains string
	}{
		{"existing consumer MaxAckPending 100, 4 replicas x 500", jetStream(4), retention.ConsumerLimits{MaxAckPending: 100},
			metav1.ConditionFalse, "MaxAckPending=100, below replicas (4) x batchSize (500) x inFlight (2) = 4000"},
		{"server default 1000 for one replica", jetStream(1), retention.ConsumerLimits{MaxAckPending: 1000}, metav1.ConditionTrue, "LimitsFit"},
		{"unlimited", jetStream(8), retention.ConsumerLimits{MaxAckPending: -1}, metav1.ConditionTrue, "LimitsFit"},
		{"consumer not created yet", jetStream(8), retention.ConsumerLimits{}, metav1.ConditionTrue, "LimitsFit"},
		{"RabbitMQ prefetch below batch x inFlight", rabbit(ptr.To(int32(100))), retention.ConsumerLimits{},
			metav1.ConditionFalse, "spec.source.rabbitmq.prefetch=100 is below batchSize (500) x inFlight (2) = 1000"},
		{"RabbitMQ default prefetch", rabbit(nil), retention.ConsumerLimits{}, metav1.ConditionTrue, "LimitsFit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, err := renderConfig(tc.idc)
			if err != nil {
				t.Fatal(err)
			}
			obs := &observation{}
			observeBrokerLimits(tc.idc, rc.Config, tc.limits, obs)
			setConditions(tc.idc, obs)
			c := meta.FindStatusCondition(tc.idc.Status.Conditions, messagingv1alpha1.ConditionBrokerLimits)
			if c == nil {
				t.Fatal("no BrokerLimits condition")
			}
			if c.Status != tc.status || !strings.Contains(c.Reason+" "+c.Message, tc.contains) {
				t.Errorf("BrokerLimits = %s %s %q, want %s containing %q", c.Status, c.Reason, c.Message, tc.status, tc.contains)
			}
			if tc.status == metav1.ConditionFalse && c.Reason != messagingv1alpha1.ReasonBrokerLimitTooSmall {
				t.Errorf("reason %s, want %s", c.Reason, messagingv1alpha1.ReasonBrokerLimitTooSmall)
			}
			if r := meta.FindStatusCondition(tc.idc.Status.Conditions, messagingv1alpha1.ConditionReady); r != nil && r.Reason == messagingv1alpha1.ReasonBrokerLimitTooSmall {
				t.Error("a too-small broker limit made the resource unready")
			}
		})
	}
}

func TestBrokerLimitsUnknownUntilTheBrokerWasRead(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "orders-db")
	setConditions(idc, &observation{secrets: failed(messagingv1alpha1.ReasonSecretNotFound, "missing")})
	c := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionBrokerLimits)
	if c == nil || c.Status != metav1.ConditionUnknown {
		t.Errorf("BrokerLimits = %+v, want Unknown while the broker was not read", c)
	}
}

// Scaling changes the rendered replicas (the runtime sizes broker limits
// from it) but not the hash, so it does not roll the pods.
func TestScalingDoesNotChangeTheConfigHash(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "orders-db")
	a, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	idc.Spec.Runtime.Replicas = ptr.To(int32(8))
	b, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash != b.Hash {
		t.Error("scaling changed the config hash")
	}
	if a.Config.Delivery.Replicas != 2 || b.Config.Delivery.Replicas != 8 {
		t.Errorf("rendered replicas %d and %d, want 2 and 8", a.Config.Delivery.Replicas, b.Config.Delivery.Replicas)
	}
	if a.Config.Delivery.InFlight != 2 {
		t.Errorf("inFlight defaulted to %d, want 2", a.Config.Delivery.InFlight)
	}
}

// BrokerLimits is Unknown, with the reason, while the broker cannot be
// read: a limit that was not read is not a limit that fits.
func TestBrokerLimitsUnknownWhileTheBrokerIsNotRead(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.broker.err = fmt.Errorf("%w: while dialing nats://127.0.0.1:4222: connection refused", retention.ErrBrokerUnreachable)
	idc, requeue := h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionBrokerLimits); got != "Unknown/BrokerUnreachable" {
		t.Fatalf("BrokerLimits = %s, want Unknown/BrokerUnreachable", got)
	}
	if requeue > DefaultRecheckPeriod {
		t.Errorf("a failed read is retried after %s, want within %s", requeue, DefaultRecheckPeriod)
	}
	// Read again after the re-check period, not after --retention-period.
	h.clk.Step(DefaultRecheckPeriod)
	h.broker.err = nil
	h.broker.limits = retention.ConsumerLimits{MaxAckPending: 100000}
	idc, _ = h.pass()
	if got := conditionOf(idc, messagingv1alpha1.ConditionBrokerLimits); got != "True/LimitsFit" {
		t.Fatalf("BrokerLimits = %s once the broker answers, want True/LimitsFit", got)
	}
	if h.broker.readCount() != 2 {
		t.Fatalf("%d reads, want 2", h.broker.readCount())
	}
}
