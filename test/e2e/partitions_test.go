package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// partitionedSample is the partitioned JetStream upsert sample a user
// applies.
const partitionedSample = "config/samples/messaging_v1alpha1_idempotentconsumer_jetstream_partitioned.yaml"

// jetStreamPartitions applies the partitioned sample with partitions: 4 on
// a stream that partitions orders.<orderId> by the order id, autoscaled
// between 2 and 3 replicas per partition, and publishes a shared-key
// workload (every order in several versions, some out of order, 10%
// re-sent past the broker's duplicate window): every id takes effect
// once, every order ends at its highest version, status shows each
// partition's lag, KEDA scales a partition on its own backlog, and no
// session of one partition ever waits for another's row locks.
func (s *suite) jetStreamPartitions(ctx context.Context, t *testing.T) {
	const partitions = 4
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), partitionedSample))
	if err != nil {
		t.Fatal(err)
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := yaml.UnmarshalStrict(b, idc); err != nil {
		t.Fatalf("the sample %s: %v", partitionedSample, err)
	}
	if ptr.Deref(idc.Spec.Source.NATSJetStream.Partitions, 0) != partitions {
		t.Fatalf("the sample %s no longer has partitions: %d", partitionedSample, partitions)
	}
	name := "parts-" + s.suffix
	stream, subject := "IDC_E2E_PARTS_"+strings.ToUpper(s.suffix), "idc-e2e-"+s.suffix+".parts"
	idc.Name, idc.Namespace = name, testNamespace
	j := idc.Spec.Source.NATSJetStream
	j.URL, j.Stream, j.Consumer = localcluster.PodNATSURL, stream, name
	idc.Spec.Sink.Postgres.ConnectionSecretRef.Name = name + "-db"
	// Small batches, one lane and a tight CPU limit: a partition drains
	// the backlog slowly enough for KEDA to add a replica to it.
	idc.Spec.Delivery = messagingv1alpha1.DeliverySpec{BatchSize: 50, InFlight: 1}
	idc.Spec.Runtime.Replicas = nil
	idc.Spec.Runtime.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("20m")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("60m")}}
	idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{
		MinReplicas: ptr.To(int32(2)), MaxReplicas: 3, LagPerReplica: ptr.To(int64(300)), PollingInterval: "2s", CooldownPeriod: "10s",
		ScaleDownStabilization: "10s", NATSAccount: "$G", NATSMonitoringURL: fmt.Sprintf("http://%s:%d", localcluster.BridgeIP, scaleMonitorPort),
	}

	db := s.dbName() + "_parts"
	dsn, err := localcluster.PrepareOrdersDatabase(ctx, db, idc)
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() {
		if !s.parent.Failed() {
			_ = localcluster.DropDatabase(context.Background(), db)
		}
	})
	// A slow effect (4 ms per row, in the projection's own trigger): the
	// runtime drains this workload in seconds otherwise, before KEDA's
	// poll and the HPA's sync have seen the backlog.
	if err := slowProjection(ctx, dsn, idc.Spec.Sink.Schema(), string(idc.Spec.Sink.Effect.Upsert.Table), 4*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	nc, js, err := localcluster.ConnectJetStream()
	if err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(nc.Close)
	// What the sample's comment tells the stream's owner to run.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{subject + ".*"}, MaxAge: time.Hour, Duplicates: localcluster.StreamDuplicateWindow,
		SubjectTransform: &jetstream.SubjectTransformConfig{Source: subject + ".*", Destination: subject + ".{{partition(4,1)}}.{{wildcard(1)}}"},
	}); err != nil {
		t.Fatalf("creating the partitioned stream %s: %v", stream, err)
	}
	s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	// The whole workload waits in the stream before the resource exists:
	// each partition's durable starts with a backlog of its share.
	w := localcluster.NewWorkload(3000, 5, 0.1, 36)
	w.KeyedSubjects = true
	stats, err := w.Publish(ctx, js, subject, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.c.Client.Create(ctx, localcluster.OrdersSecret(idc, localcluster.PodDSN(dsn))); err != nil {
		t.Fatal(err)
	}

	// Every partition's Deployment and max replicas while the backlog
	// drains; row-lock waits in the sink database, sampled.
	var mu sync.Mutex
	peak := map[string]int32{}
	lockSamples, crossSamples, samples := 0, 0, 0
	sctx, stopSampling := context.WithCancel(ctx)
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		conn, err := pgx.Connect(sctx, dsn)
		if err != nil {
			return
		}
		defer func() { _ = conn.Close(context.Background()) }()
		for sctx.Err() == nil {
			// Every row-lock wait (on another transaction or a tuple; not
			// a relation's extension lock, which every writer of a table
			// shares), and those whose blocker serves another partition
			// (the runtime's application_name is "idc-runtime p<i>").
			var waiting, across int
			err := conn.QueryRow(sctx, `SELECT count(*), count(*) FILTER (WHERE EXISTS (
				SELECT 1 FROM unnest(pg_blocking_pids(w.pid)) b JOIN pg_stat_activity h ON h.pid = b
				WHERE h.application_name LIKE 'idc-runtime p%' AND h.application_name <> w.application_name))
				FROM pg_stat_activity w WHERE w.datname = current_database() AND w.wait_event_type = 'Lock'
				AND w.wait_event IN ('transactionid', 'tuple')`).Scan(&waiting, &across)
			for i := range partitions {
				var d appsv1.Deployment
				if s.c.Client.Get(sctx, client.ObjectKey{Namespace: testNamespace, Name: fmt.Sprintf("%s-p%d", name, i)}, &d) == nil {
					mu.Lock()
					peak[d.Name] = max(peak[d.Name], ptr.Deref(d.Spec.Replicas, 0))
					mu.Unlock()
				}
			}
			if err == nil {
				mu.Lock()
				samples++
				if waiting > 0 {
					lockSamples++
				}
				if across > 0 {
					crossSamples++
				}
				mu.Unlock()
			}
			select {
			case <-sctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	if err := s.c.Client.Create(ctx, idc); err != nil {
		t.Fatalf("applying the partitioned sample: %v", err)
	}
	s.parent.Cleanup(func() { _ = s.c.Client.Delete(context.Background(), idc) })
	dctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for i := range partitions {
		// A durable that does not exist yet is polled until it does.
		if _, err := localcluster.WaitDrained(dctx, js, stream, config.PartitionConsumer(name, i), nil); err != nil {
			pods, _ := s.c.ConsumerPods(ctx, idc)
			t.Fatalf("partition %d: %v\npods:%s", i, err, localcluster.DescribePods(pods))
		}
	}
	stopSampling()
	sampled.Wait()
	out, err := w.Verify(ctx, dsn, idc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("PARTITIONS published %+v; outcome %+v; row-lock waits in %d of %d samples, between partitions in %d; peak replicas per partition %v", stats, out, lockSamples, samples, crossSamples, peak)
	if !out.OK() || out.DeadLetterRows != len(w.Poison) {
		t.Fatalf("not exactly one effect per id, or an order not at its highest version (dead letters %d, want %d): %+v", out.DeadLetterRows, len(w.Poison), out)
	}
	// A key reaches one partition only: no session of one partition ever
	// waits for another's. Waits inside a partition are printed, not
	// asserted: its replicas share its durable, so a key's versions can meet
	// in two of them at once (docs/tune.md).
	if crossSamples != 0 {
		t.Errorf("lock waits between partitions in %d of %d samples: a key reached two partitions", crossSamples, samples)
	}
	if samples == 0 {
		t.Errorf("no lock sample was taken while the partitions drained")
	}
	scaled := 0
	for _, r := range peak {
		if r > 2 {
			scaled++
		}
	}
	if scaled == 0 {
		t.Errorf("no partition was scaled above minReplicas 2 by KEDA on its own backlog (peaks %v)", peak)
	}

	// Each partition's lag in status, read by the manager from its own
	// durable (the suite's --retention-period is 10 s).
	var got messagingv1alpha1.IdempotentConsumer
	if err := localcluster.Eventually(ctx, time.Minute, func() error {
		if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(idc), &got); err != nil {
			return err
		}
		if ready := localcluster.Condition(&got, messagingv1alpha1.ConditionReady); !strings.HasPrefix(ready, "True") {
			return fmt.Errorf("Ready is %s after the drain", ready)
		}
		if len(got.Status.Partitions) != partitions {
			return fmt.Errorf("status.partitions %+v, want %d", got.Status.Partitions, partitions)
		}
		var errs []error
		for i, p := range got.Status.Partitions {
			if p.Consumer != config.PartitionConsumer(name, i) || p.Lag == nil || *p.Lag != 0 {
				errs = append(errs, fmt.Errorf("partition %d: %+v, want consumer %s and lag 0 after the drain", i, p, config.PartitionConsumer(name, i)))
			}
		}
		return errors.Join(errs...)
	}); err != nil {
		t.Fatal(err)
	}
	status := s.pluginOK(ctx, t, "status", name)
	for i := range partitions {
		if !strings.Contains(status, config.PartitionConsumer(name, i)) {
			t.Errorf("kubectl idc status does not list partition %d's consumer %s", i, config.PartitionConsumer(name, i))
		}
	}
	if !strings.Contains(status, "Partitions:") {
		t.Errorf("kubectl idc status has no Partitions table")
	}
}

// slowProjection makes every row written to schema.table take d (a BEFORE
// INSERT trigger, which an upsert fires for each row it proposes).
func slowProjection(ctx context.Context, dsn, schema, table string, d time.Duration) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	fn := pgx.Identifier{schema, "idc_e2e_slow_row"}.Sanitize()
	for _, q := range []string{
		fmt.Sprintf("CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(%g); RETURN NEW; END $$", fn, d.Seconds()),
		fmt.Sprintf("CREATE TRIGGER idc_e2e_slow_row BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()", pgx.Identifier{schema, table}.Sanitize(), fn),
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}
