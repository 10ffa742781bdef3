package controllers

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// Field indexes that find two resources claiming the same inbox table or the
// same broker consumer (group), which would split or double the work.
const (
	inboxIndexKey    = ".spec.inboxIdentity"
	consumerIndexKey = ".spec.consumerIdentity"
)

// inboxIdentity is the inbox's schema-qualified name. It only finds the
// resources to wake when one goes away (rivalsOf): whether two resources
// share one table is the database's to say (the inbox's meta row records
// its owner, whatever Secret, namespace or cluster reaches it), never a
// guess from Secret names.
func inboxIdentity(idc *messagingv1alpha1.IdempotentConsumer) string {
	return schemaOf(idc) + "." + string(idc.Spec.Sink.Inbox.Table)
}

// consumerIdentity names the broker-side consumer whose messages this resource
// takes: a second resource on it would steal half of them.
func consumerIdentity(idc *messagingv1alpha1.IdempotentConsumer) string {
	s := idc.Spec.Source
	switch {
	case s.NATSJetStream != nil:
		return fmt.Sprintf("nats|%s|%s|%s", s.NATSJetStream.URL, s.NATSJetStream.Stream, s.NATSJetStream.Consumer)
	case s.Kafka != nil:
		return fmt.Sprintf("kafka|%s|%s", strings.Join(s.Kafka.BootstrapServers, ","), s.Kafka.ConsumerGroup)
	case s.RabbitMQ != nil:
		return fmt.Sprintf("rabbitmq|%s/%s/%s|%s", idc.Namespace, s.RabbitMQ.URISecretRef.Name, s.RabbitMQ.URISecretRef.Key, s.RabbitMQ.Queue)
	case s.RedisStreams != nil:
		return fmt.Sprintf("redis|%s|%s|%s", s.RedisStreams.Address, s.RedisStreams.Stream, s.RedisStreams.Group)
	}
	return ""
}

// olderThan orders resources by creation, then name, so exactly one of two
// claimants wins and the newer one reports the conflict.
func olderThan(a, b *messagingv1alpha1.IdempotentConsumer) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
}

// findConflict returns a message naming an older resource that claims the
// same broker consumer, or "" when there is none. The inbox's owner is
// checked in the database (inboxPhase).
func (r *Reconciler) findConflict(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) (string, error) {
	checks := []struct{ index, value, what string }{
		{consumerIndexKey, consumerIdentity(idc), "broker consumer"},
	}
	for _, c := range checks {
		var list messagingv1alpha1.IdempotentConsumerList
		if err := r.client.List(ctx, &list, client.MatchingFields{c.index: c.value}); err != nil {
			return "", fmt.Errorf("listing resources by %s: %w", c.index, err)
		}
		for i := range list.Items {
			other := &list.Items[i]
			if other.UID == idc.UID || !other.DeletionTimestamp.IsZero() {
				continue
			}
			if olderThan(other, idc) {
				return fmt.Sprintf("IdempotentConsumer %s/%s already owns the %s; delete one of the two or change this one", other.Namespace, other.Name, c.what), nil
			}
		}
	}
	return "", nil
}
