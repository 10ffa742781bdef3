package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// scaleNATS is a JetStream client to the suite's nats-server (suiteNATS),
// whose monitoring endpoint KEDA's nats-jetstream scaler reads.
func (s *suite) scaleNATS(ctx context.Context, t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(localcluster.NATSURL, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("the suite's nats-server at %s: %v", localcluster.NATSURL, err)
	}
	s.parent.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// scaleFixture is one autoscaled consumer: JetStream -> append into
// e2e.scaled_<name> (no unique key: an effect applied twice is a second
// row).
type scaleFixture struct {
	name, stream, subject, table string
	dsn                          string
	idc                          *messagingv1alpha1.IdempotentConsumer
}

func (s *suite) newScaleFixture(ctx context.Context, t *testing.T, js jetstream.JetStream, name string, auto messagingv1alpha1.AutoscalingSpec) *scaleFixture {
	t.Helper()
	f := &scaleFixture{name: name, stream: "IDC_SCALE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_" + strings.ToUpper(s.suffix),
		subject: "idc-scale-" + s.suffix + "." + name, table: "scaled_" + strings.ReplaceAll(name, "-", "_")}
	db := s.dbName() + "_scale"
	dsn, err := localcluster.DatabaseDSN(db)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		if dsn, err = localcluster.RecreateDatabase(ctx, db); err != nil {
			t.Fatal(err)
		}
		s.parent.Cleanup(func() {
			if !s.parent.Failed() {
				_ = localcluster.DropDatabase(context.Background(), db)
			}
		})
		if conn, err = pgx.Connect(ctx, dsn); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { _ = conn.Close(context.Background()) }()
	f.dsn = dsn
	for _, q := range []string{"CREATE SCHEMA IF NOT EXISTS e2e",
		fmt.Sprintf("CREATE TABLE e2e.%s (event_id text NOT NULL, num int NOT NULL)", f.table)} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := localcluster.RecreateOrdersStream(ctx, js, f.stream, f.subject); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = js.DeleteStream(context.Background(), f.stream) })
	secret := name + "-db"
	s.secret(ctx, t, secret, map[string]string{"dsn": localcluster.PodDSN(dsn)})
	auto.NATSMonitoringURL = fmt.Sprintf("http://%s:%d", localcluster.BridgeIP, scaleMonitorPort)
	f.idc = &messagingv1alpha1.IdempotentConsumer{}
	f.idc.Name, f.idc.Namespace = name, testNamespace
	f.idc.Spec = messagingv1alpha1.IdempotentConsumerSpec{
		Source: messagingv1alpha1.SourceSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamSource{
			URL: fmt.Sprintf("nats://%s:%d", localcluster.BridgeIP, scaleNATSPort), Stream: f.stream, Consumer: name, FilterSubject: f.subject + ".>"}},
		Message: messagingv1alpha1.MessageSpec{ID: messagingv1alpha1.IDSpec{Header: "Nats-Msg-Id"}},
		Sink: messagingv1alpha1.SinkSpec{
			Postgres: &messagingv1alpha1.PostgresSpec{ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: secret, Key: "dsn"}, Schema: "e2e"},
			Inbox:    messagingv1alpha1.InboxSpec{Table: messagingv1alpha1.SQLIdentifier("inbox_" + f.table)},
			Effect: messagingv1alpha1.EffectSpec{Append: &messagingv1alpha1.AppendEffect{Table: messagingv1alpha1.SQLIdentifier(f.table),
				Columns: messagingv1alpha1.Columns{"event_id": "@messageId", "num": "$.n"}}},
		},
		// Small batches, one lane and a CPU limit: one replica drains the
		// backlog slowly enough that scaling up visibly pays.
		Delivery: messagingv1alpha1.DeliverySpec{BatchSize: 50, InFlight: 1},
		Runtime: messagingv1alpha1.RuntimeSpec{Autoscaling: &auto, Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("150m")}}},
	}
	if err := s.c.Client.Create(ctx, f.idc); err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
	s.parent.Cleanup(func() { _ = s.c.Client.Delete(context.Background(), f.idc) })
	return f
}

// publish sends ids [from, from+n) and waits for the stream's acks.
func (f *scaleFixture) publish(ctx context.Context, t *testing.T, js jetstream.JetStream, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		msg := nats.NewMsg(f.subject + ".events")
		msg.Header.Set("Nats-Msg-Id", fmt.Sprintf("%s-%d", f.name, i))
		msg.Data = fmt.Appendf(nil, `{"n":%d}`, i)
		if _, err := js.PublishMsgAsync(msg); err != nil {
			t.Fatalf("publishing: %v", err)
		}
		if i%2000 == 1999 {
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		t.Fatal("publishing did not complete")
	}
}

// effects counts the effect rows and the distinct ids among them.
func (f *scaleFixture) effects(ctx context.Context, t *testing.T) (rows, distinct int) {
	t.Helper()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*), count(DISTINCT event_id) FROM e2e.%s", f.table)).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// waitReplicas waits until the consumer Deployment asks for want replicas
// (and, with ready, has them all ready); it returns how long that took.
func (s *suite) waitReplicas(ctx context.Context, t *testing.T, f *scaleFixture, within time.Duration, ready bool, want func(int32) bool, what string) time.Duration {
	t.Helper()
	start := time.Now()
	var d appsv1.Deployment
	if err := localcluster.Eventually(ctx, within, func() error {
		if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: f.name}, &d); err != nil {
			return err
		}
		r := ptr.Deref(d.Spec.Replicas, 1)
		if !want(r) || (ready && d.Status.ReadyReplicas != r) {
			return fmt.Errorf("replicas %d (ready %d), want %s", r, d.Status.ReadyReplicas, what)
		}
		return nil
	}); err != nil {
		var idc messagingv1alpha1.IdempotentConsumer
		_ = s.c.Client.Get(ctx, client.ObjectKeyFromObject(f.idc), &idc)
		out, _ := s.c.KubectlCmd(ctx, "-n", testNamespace, "get", "scaledobject,hpa", "-o", "wide")
		t.Fatalf("%s: %v\nstatus.runtime %+v\n%s", f.name, err, idc.Status.Runtime, out)
	}
	return time.Since(start)
}

// scaleEvents lists the ScaledUp/ScaledDown events on the resource.
func (s *suite) scaleEvents(ctx context.Context, f *scaleFixture) []string {
	var list corev1.EventList
	_ = s.c.Client.List(ctx, &list, client.InNamespace(testNamespace))
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Name == f.name && e.InvolvedObject.Kind == "IdempotentConsumer" && (e.Reason == "ScaledUp" || e.Reason == "ScaledDown") {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}

// autoscaleOnLag: a 30,000-message backlog scales the consumer from 1 to
// maxReplicas (4) through KEDA's nats-jetstream scaler and the HPA, the
// consumer drains it, and scales back to minReplicas; every message has
// exactly one effect across the scale events.
func (s *suite) autoscaleOnLag(ctx context.Context, t *testing.T) {
	js := s.scaleNATS(ctx, t)
	f := s.newScaleFixture(ctx, t, js, "scaled", messagingv1alpha1.AutoscalingSpec{
		MinReplicas: ptr.To(int32(1)), MaxReplicas: 4, LagPerReplica: ptr.To(int64(1000)), PollingInterval: "2s", CooldownPeriod: "10s",
		ScaleDownStabilization: "10s", NATSAccount: "$G",
	})
	s.waitReady(ctx, t, f.idc, 1)
	// Large enough that one replica cannot drain it before KEDA's first
	// poll and the HPA's sync: at 30,000 a runtime 4% faster than the one
	// the step was tuned on drained it (lag 0 at every poll) and never
	// scaled.
	const backlog = 100000
	start := time.Now()
	f.publish(ctx, t, js, 0, backlog)
	published := time.Since(start)
	if c, err := js.Consumer(ctx, f.stream, f.name); err == nil {
		if info, err := c.Info(ctx); err == nil {
			t.Logf("backlog published in %s: the consumer has %d pending and %d unacknowledged (acknowledged %d)",
				published.Round(time.Millisecond), info.NumPending, info.NumAckPending, info.AckFloor.Consumer)
		}
	}
	up := s.waitReplicas(ctx, t, f, 3*time.Minute, false, func(r int32) bool { return r == 4 }, "4 (maxReplicas)")
	// The pods may not all get ready before the backlog is gone (a fast
	// drain scales back down first): the peak of ready replicas is logged.
	readyStart := time.Now()
	peak := int32(0)
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		var d appsv1.Deployment
		if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: f.name}, &d); err != nil {
			return err
		}
		peak = max(peak, d.Status.ReadyReplicas)
		if peak == 4 {
			return nil
		}
		if c, err := js.Consumer(ctx, f.stream, f.name); err == nil {
			if info, err := c.Info(ctx); err == nil && info.NumPending == 0 && info.NumAckPending == 0 {
				return nil
			}
		}
		return fmt.Errorf("%d of 4 replicas ready and a backlog left", d.Status.ReadyReplicas)
	}); err != nil {
		t.Fatalf("%s: %v", f.name, err)
	}
	t.Logf("TIME-TO-SCALE up: backlog of %d published in %s; Deployment at 4 replicas %s after the last publish, %d of 4 ready %s later (all 4, or the backlog was gone first)",
		backlog, published.Round(time.Millisecond), up.Round(time.Second), peak, time.Since(readyStart).Round(time.Second))
	dctx, cancel := context.WithTimeout(ctx, 6*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, js, f.stream, f.name, nil); err != nil {
		t.Fatal(err)
	}
	drained := time.Since(start)
	down := s.waitReplicas(ctx, t, f, 3*time.Minute, true, func(r int32) bool { return r == 1 }, "1 (minReplicas)")
	t.Logf("TIME-TO-SCALE drain: %d messages drained %s after the first publish; back to 1 replica %s after the drain", backlog, drained.Round(time.Second), down.Round(time.Second))
	rows, distinct := f.effects(ctx, t)
	if rows != backlog || distinct != backlog {
		t.Fatalf("effects: %d rows, %d distinct ids; want %d of each (0 doubled, 0 lost)", rows, distinct, backlog)
	}
	t.Logf("effects: %d rows = %d distinct ids = %d published: 0 doubled, 0 lost", rows, distinct, backlog)
	var idc messagingv1alpha1.IdempotentConsumer
	if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(f.idc), &idc); err != nil {
		t.Fatal(err)
	}
	if c := localcluster.Condition(&idc, messagingv1alpha1.ConditionAutoscaling); c != "True/"+messagingv1alpha1.ReasonScaledByKEDA {
		t.Fatalf("Autoscaling condition %s, want True/ScaledByKEDA", c)
	}
	events := s.scaleEvents(ctx, f)
	if !strings.Contains(strings.Join(events, "\n"), "ScaledUp") || !strings.Contains(strings.Join(events, "\n"), "ScaledDown") {
		t.Fatalf("scale events on the resource: %q, want ScaledUp and ScaledDown", events)
	}
	t.Logf("events: %s", strings.Join(events, " | "))
}

// autoscaleFromZero: with minReplicas 0 the consumer goes to 0 replicas
// (no pod left) when idle, and KEDA wakes it when new messages arrive; every
// message has exactly one effect across the scale to zero and back.
func (s *suite) autoscaleFromZero(ctx context.Context, t *testing.T) {
	js := s.scaleNATS(ctx, t)
	f := s.newScaleFixture(ctx, t, js, "scaled-zero", messagingv1alpha1.AutoscalingSpec{
		MinReplicas: ptr.To(int32(0)), MaxReplicas: 2, LagPerReplica: ptr.To(int64(1000)), PollingInterval: "2s", CooldownPeriod: "10s",
		ScaleDownStabilization: "10s", NATSAccount: "$G",
	})
	// The first pod creates the durable consumer KEDA's scaler reads; a
	// first batch runs through it before the consumer goes idle.
	const first, second = 200, 500
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		_, err := js.Consumer(ctx, f.stream, f.name)
		return err
	}); err != nil {
		t.Fatalf("the runtime never created its durable consumer %s (did KEDA scale the new Deployment to 0 before its first pod ran?): %v\n%s",
			f.name, err, s.scaleDiagnostics(ctx, f))
	}
	f.publish(ctx, t, js, 0, first)
	dctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if _, err := localcluster.WaitDrained(dctx, js, f.stream, f.name, nil); err != nil {
		t.Fatalf("%v\n%s", err, s.scaleDiagnostics(ctx, f))
	}
	idle := s.waitReplicas(ctx, t, f, 3*time.Minute, false, func(r int32) bool { return r == 0 }, "0 (minReplicas, idle)")
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		// Terminating pods too: one still running its last fetches
		// would take the messages published next.
		var d appsv1.Deployment
		if err := s.c.Client.Get(ctx, client.ObjectKeyFromObject(f.idc), &d); err != nil {
			return err
		}
		pods, err := s.c.Pods(ctx, testNamespace, d.Spec.Selector.MatchLabels)
		if err == nil && len(pods) > 0 {
			err = fmt.Errorf("%d consumer pods left (terminating included)", len(pods))
		}
		return err
	}); err != nil {
		t.Fatalf("scaled to 0 but pods remain: %v", err)
	}
	t.Logf("TIME-TO-SCALE to zero: %d messages drained, Deployment at 0 replicas %s later, no pod left", first, idle.Round(time.Second))

	start := time.Now()
	f.publish(ctx, t, js, first, second)
	// What KEDA reads: the same /jsz query its nats-jetstream scaler sends.
	// A backlog that does not show here is the broker's side, not KEDA's.
	if err := localcluster.Eventually(ctx, 30*time.Second, func() error {
		pending, err := jszLag(ctx, f)
		if err == nil && pending < second {
			err = fmt.Errorf("/jsz reports a lag of %d for consumer %s, want %d", pending, f.name, second)
		}
		return err
	}); err != nil {
		var state string
		if st, err := js.Stream(ctx, f.stream); err == nil {
			state = fmt.Sprintf("stream %s: %d messages, last sequence %d", f.stream, st.CachedInfo().State.Msgs, st.CachedInfo().State.LastSeq)
		}
		if c, err := js.Consumer(ctx, f.stream, f.name); err == nil {
			i := c.CachedInfo()
			state += fmt.Sprintf("; consumer: pending %d, ack pending %d, delivered %d, ack floor %d, waiting %d",
				i.NumPending, i.NumAckPending, i.Delivered.Stream, i.AckFloor.Stream, i.NumWaiting)
		}
		t.Fatalf("%v\n%s\n%s", err, state, s.scaleDiagnostics(ctx, f))
	}
	woke := s.waitReplicas(ctx, t, f, 3*time.Minute, false, func(r int32) bool { return r >= 1 }, "at least 1 (woken by the backlog)")
	wokeReady := s.waitReplicas(ctx, t, f, 3*time.Minute, true, func(r int32) bool { return r >= 1 }, "at least 1 ready")
	dctx2, cancel2 := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel2()
	if _, err := localcluster.WaitDrained(dctx2, js, f.stream, f.name, nil); err != nil {
		t.Fatalf("%v\n%s", err, s.scaleDiagnostics(ctx, f))
	}
	drained := time.Since(start)
	t.Logf("TIME-TO-SCALE from zero: %d messages published; Deployment above 0 replicas %s after the last publish, ready %s later, drained %s after the first publish",
		second, woke.Round(time.Second), wokeReady.Round(time.Second), drained.Round(time.Second))
	rows, distinct := f.effects(ctx, t)
	if rows != first+second || distinct != first+second {
		t.Fatalf("effects: %d rows, %d distinct ids; want %d of each (0 doubled, 0 lost)", rows, distinct, first+second)
	}
	t.Logf("effects: %d rows = %d distinct ids = %d published: 0 doubled, 0 lost", rows, distinct, first+second)
}

// jszLag is the lag KEDA's nats-jetstream scaler computes for f's consumer
// (num_pending + num_ack_pending) from the same monitoring query.
func jszLag(ctx context.Context, f *scaleFixture) (int64, error) {
	u := fmt.Sprintf("http://%s:%d/jsz?acc=%%24G&consumers=true&config=true", localcluster.BridgeIP, scaleMonitorPort)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	var jsz struct {
		Accounts []struct {
			Name    string `json:"name"`
			Streams []struct {
				Name      string `json:"name"`
				Consumers []struct {
					Name          string `json:"name"`
					NumPending    int64  `json:"num_pending"`
					NumAckPending int64  `json:"num_ack_pending"`
				} `json:"consumer_detail"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		return 0, fmt.Errorf("decoding %s: %w", u, err)
	}
	for _, a := range jsz.Accounts {
		for _, st := range a.Streams {
			for _, c := range st.Consumers {
				if st.Name == f.stream && c.Name == f.name {
					return c.NumPending + c.NumAckPending, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("%s lists no consumer %s on stream %s", u, f.name, f.stream)
}

// scaleDiagnostics is what explains a consumer KEDA did not scale: the
// ScaledObject and HPA, and the KEDA operator's last log lines.
func (s *suite) scaleDiagnostics(ctx context.Context, f *scaleFixture) string {
	var b strings.Builder
	lag, err := jszLag(ctx, f)
	fmt.Fprintf(&b, "/jsz lag %d (%v)\n", lag, err)
	for _, args := range [][]string{
		{"-n", testNamespace, "get", "scaledobject", f.name, "-o", "yaml"},
		{"-n", testNamespace, "get", "hpa,deployment,pods", "-o", "wide"},
		{"-n", "keda", "logs", "deployment/keda-operator", "--tail=60"},
	} {
		out, _ := s.c.KubectlCmd(ctx, args...)
		fmt.Fprintf(&b, "kubectl %s:\n%s\n", strings.Join(args, " "), out)
	}
	return b.String()
}
