package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// SamplePath is the JetStream -> PostgreSQL upsert sample, relative to the
// repository root.
const SamplePath = "config/samples/messaging_v1alpha1_idempotentconsumer_jetstream_upsert.yaml"

// StreamDuplicateWindow is JetStream's own Nats-Msg-Id dedup window on the
// scenario's stream: the smallest the server accepts, so that re-sends a
// little later (like redeliveries and replays, which that window never
// covers) reach the consumer and the inbox has to catch them.
const StreamDuplicateWindow = 100 * time.Millisecond

// OrdersSetup adapts the sample to the local services.
type OrdersSetup struct {
	Namespace string
	// Name of the resource; also the durable consumer (sample: orders-projector).
	Name string
	// Stream is the JetStream stream; it holds Subject + ".>".
	Stream  string
	Subject string
	// Secret holds the DSN under key "dsn" (sample: orders-db).
	Secret   string
	Replicas int32
}

// LoadOrdersSample reads the sample and points it at the local services as
// pods on the node see them: the NATS URL, the stream and its subjects, the Secret, the replicas.
func LoadOrdersSample(s OrdersSetup) (*messagingv1alpha1.IdempotentConsumer, error) {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), SamplePath))
	if err != nil {
		return nil, fmt.Errorf("reading the sample: %w", err)
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := yaml.UnmarshalStrict(b, idc); err != nil {
		return nil, fmt.Errorf("parsing the sample %s: %w", SamplePath, err)
	}
	js := idc.Spec.Source.NATSJetStream
	if js == nil || idc.Spec.Sink.Effect.Upsert == nil || idc.Spec.Sink.Postgres == nil {
		return nil, fmt.Errorf("the sample %s is no longer a JetStream upsert into PostgreSQL", SamplePath)
	}
	idc.Name, idc.Namespace = s.Name, s.Namespace
	js.URL, js.Stream, js.Consumer, js.FilterSubject = PodNATSURL, s.Stream, s.Name, s.Subject+".>"
	idc.Spec.Sink.Postgres.ConnectionSecretRef.Name = s.Secret
	idc.Spec.Runtime.Replicas = ptr.To(s.Replicas)
	return idc, nil
}

// OrdersSecret is the Secret holding the sink DSN.
func OrdersSecret(idc *messagingv1alpha1.IdempotentConsumer, dsn string) *corev1.Secret {
	ref := idc.Spec.Sink.ConnectionSecretRef()
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: idc.Namespace, Name: ref.Name},
		StringData: map[string]string{ref.Key: dsn},
	}
}

// PrepareOrdersDatabase recreates the database and the sample's projection
// table (the effect's target, which the user owns, not the operator).
func PrepareOrdersDatabase(ctx context.Context, name string, idc *messagingv1alpha1.IdempotentConsumer) (string, error) {
	dsn, err := RecreateDatabase(ctx, name)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("connecting to %s: %w", name, err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	schema := idc.Spec.Sink.Schema()
	table := pgx.Identifier{schema, string(idc.Spec.Sink.Effect.Upsert.Table)}.Sanitize()
	for _, stmt := range []string{
		"CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{schema}.Sanitize(),
		"CREATE TABLE " + table + " (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)",
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return "", fmt.Errorf("running %q: %w", stmt, err)
		}
	}
	return dsn, nil
}

// RecreateOrdersStream deletes the stream if it exists and creates it with a
// bounded MaxAge (so the retention window derives) and the smallest
// duplicate window.
func RecreateOrdersStream(ctx context.Context, js jetstream.JetStream, stream, subject string) error {
	if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deleting stream %s: %w", stream, err)
	}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subject + ".>"}, MaxAge: time.Hour, Duplicates: StreamDuplicateWindow,
	})
	if err != nil {
		return fmt.Errorf("creating stream %s: %w", stream, err)
	}
	return nil
}

// WaitDrained waits until the durable consumer has nothing pending or
// unacknowledged; progress, when set, is called on every poll.
func WaitDrained(ctx context.Context, js jetstream.JetStream, stream, consumer string, progress func(*jetstream.ConsumerInfo)) (*jetstream.ConsumerInfo, error) {
	for {
		var info *jetstream.ConsumerInfo
		c, err := js.Consumer(ctx, stream, consumer)
		if err == nil {
			info, err = c.Info(ctx)
		}
		if err == nil && progress != nil {
			progress(info)
		}
		if err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Stream > 0 {
			return info, nil
		}
		select {
		case <-ctx.Done():
			return info, errors.Join(fmt.Errorf("waiting for consumer %s on %s to drain: %w", consumer, stream, ctx.Err()), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
