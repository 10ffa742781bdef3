package controllers

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
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
	return idc.Spec.Sink.Schema() + "." + string(idc.Spec.Sink.Inbox.Table)
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
		// The broker is in the URI Secret: resources on one queue name are
		// candidates, and sameRabbitMQ compares the brokers they reach.
		return "rabbitmq|" + s.RabbitMQ.Queue
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
			if idc.Spec.Source.RabbitMQ != nil {
				same, err := r.sameRabbitMQ(ctx, idc, other)
				if err != nil {
					return "", err
				}
				if !same {
					continue
				}
			}
			if olderThan(other, idc) {
				return fmt.Sprintf("IdempotentConsumer %s/%s already owns the %s; delete one of the two or change this one", other.Namespace, other.Name, c.what), nil
			}
		}
	}
	return "", nil
}

// sameRabbitMQ says whether two resources on one queue name reach the same
// broker and virtual host, whatever Secrets (in whichever namespaces) hold
// their URIs: two Secrets with one URI share the queue, and the consumer
// would take half of its messages. A URI that cannot be read proves
// nothing: that resource is not consuming either.
func (r *Reconciler) sameRabbitMQ(ctx context.Context, a, b *messagingv1alpha1.IdempotentConsumer) (bool, error) {
	ea, err := r.rabbitEndpoint(ctx, a)
	if err != nil || ea == "" {
		return false, err
	}
	eb, err := r.rabbitEndpoint(ctx, b)
	if err != nil || eb == "" {
		return false, err
	}
	return ea == eb, nil
}

// rabbitEndpoint is host:port/vhost of the resource's RabbitMQ URI (never
// its credentials); "" when its Secret or key is missing or the URI does
// not parse.
func (r *Reconciler) rabbitEndpoint(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) (string, error) {
	ref := idc.Spec.Source.RabbitMQ.URISecretRef
	var sec corev1.Secret
	if err := r.secrets.Get(ctx, types.NamespacedName{Namespace: idc.Namespace, Name: ref.Name}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading the RabbitMQ URI Secret %s/%s to compare brokers: %w", idc.Namespace, ref.Name, err)
	}
	return amqpEndpoint(string(sec.Data[ref.Key])), nil
}

// amqpEndpoint normalizes an AMQP URI to host:port/vhost: the host
// lowercased, the default port filled in, the vhost unescaped ("/" when
// empty); "" when it does not parse.
func amqpEndpoint(uri string) string {
	u, err := url.Parse(strings.TrimSpace(uri))
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "5672"
		if u.Scheme == "amqps" {
			port = "5671"
		}
	}
	vhost := "/"
	if p := strings.TrimPrefix(u.Path, "/"); p != "" {
		if v, err := url.PathUnescape(p); err == nil {
			vhost = v
		}
	}
	return strings.ToLower(u.Hostname()) + ":" + port + "/" + vhost
}

// conflictPhase stalls a resource that claims the inbox table or broker
// consumer an older resource owns.
func (r *Reconciler) conflictPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	conflict, err := r.findConflict(ctx, s.idc)
	if err != nil {
		return ctrl.Result{}, err
	}
	if conflict != "" {
		s.stall(messagingv1alpha1.ReasonConflict, conflict)
	}
	return ctrl.Result{}, nil
}
