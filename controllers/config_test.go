package controllers

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

func TestRenderConfigIsStableAndCarriesNoCredentials(t *testing.T) {
	idc := newConsumer("orders", "ORDERS", "orders-db")
	idc.Namespace = "shop"
	idc.Spec.Delivery = messagingv1alpha1.DeliverySpec{BatchSize: 200, MaxWait: "100ms", MaxAttempts: 3,
		Backoff: messagingv1alpha1.BackoffSpec{Initial: "1s", Max: "30s"}}
	a, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	b, err := renderConfig(idc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash != b.Hash || string(a.JSON) != string(b.JSON) {
		t.Fatalf("rendering is not deterministic:\n%s\n%s", a.JSON, b.JSON)
	}
	c := a.Config
	if c.Sink.Effect.Upsert.SequenceColumn != "version" {
		t.Errorf("sequenceColumn defaulted to %q, want the column mapped from the entity sequence (version)", c.Sink.Effect.Upsert.SequenceColumn)
	}
	if c.Delivery.BatchSize != 200 || c.Delivery.MaxWait.Duration != 100*time.Millisecond || c.Delivery.BackoffMax.Duration != 30*time.Second {
		t.Errorf("delivery not rendered: %+v", c.Delivery)
	}
	if c.Name != "shop/orders" || c.Sink.DSNEnv != envPostgresDSN || c.Sink.DeadLetterTable != "" {
		t.Errorf("unexpected config: name %q dsnEnv %q deadLetters %q", c.Name, c.Sink.DSNEnv, c.Sink.DeadLetterTable)
	}
	if len(a.Secrets) != 1 || a.Secrets[0].Ref.Name != "orders-db" {
		t.Errorf("secrets = %+v, want the DSN Secret only", a.Secrets)
	}

	idc.Spec.Delivery.BatchSize = 300
	changed, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Hash == a.Hash {
		t.Fatal("a spec change must change the config hash (it rolls the pods)")
	}
}

// A MySQL sink renders sink.kind mysql, its database as the schema, and its
// DSN through IDC_MYSQL_DSN from the mysql block's Secret; a PostgreSQL
// sink's config keeps no kind (the bytes, and so the hash, it had before
// MySQL existed: no pod rolls on upgrade).
func TestRenderConfigOfAMySQLSink(t *testing.T) {
	pg := newConsumer("orders", "ORDERS", "orders-db")
	pgRC, err := renderConfig(pg)
	if err != nil {
		t.Fatal(err)
	}
	if pgRC.Config.Sink.Kind != "" || strings.Contains(string(pgRC.JSON), `"kind"`) || pgRC.Config.Sink.Schema != "projections" {
		t.Errorf("postgres sink rendered kind %q schema %q:\n%s", pgRC.Config.Sink.Kind, pgRC.Config.Sink.Schema, pgRC.JSON)
	}

	idc := newConsumer("orders", "ORDERS", "orders-db")
	idc.Spec.Sink.Postgres = nil
	idc.Spec.Sink.MySQL = &messagingv1alpha1.MySQLSpec{
		ConnectionSecretRef: messagingv1alpha1.SecretKeyRef{Name: "orders-mysql", Key: "dsn"}, Database: "shop"}
	long := strings.Repeat("t", 64) // MySQL keeps 64 characters
	idc.Spec.Sink.Inbox.Table = messagingv1alpha1.SQLIdentifier(long)
	idc.Spec.Sink.Inbox.Layout = messagingv1alpha1.InboxLayoutPartitioned
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	s := rc.Config.Sink
	if s.Kind != config.SinkMySQL || s.DatabaseKind() != config.SinkMySQL || s.Schema != "shop" || s.InboxTable != long || s.Layout != config.LayoutPartitioned {
		t.Errorf("sink = %+v", s)
	}
	if s.DSNEnv != envMySQLDSN || len(rc.Secrets) != 1 || rc.Secrets[0].Env != envMySQLDSN || rc.Secrets[0].Ref.Name != "orders-mysql" || rc.Secrets[0].Ref.Key != "dsn" {
		t.Errorf("dsnEnv %q secrets %+v, want %s from orders-mysql/dsn only", s.DSNEnv, rc.Secrets, envMySQLDSN)
	}
	if rc.Hash == pgRC.Hash {
		t.Error("switching the database must change the config hash")
	}
	// The Secret reaches every pod the runtime runs in under that name:
	// the consumers, the prune CronJob's and the redrive Job's.
	for what, pod := range map[string]corev1.PodSpec{
		"Deployment": specs.Deployment(idc, &rc.RuntimeConfig, "img", "h", specs.Workloads(idc)[0]).Spec.Template.Spec,
		"CronJob":    specs.PruneCronJob(idc, &rc.RuntimeConfig, "img", "h", time.Hour).Spec.JobTemplate.Spec.Template.Spec,
		"Job":        specs.RedriveJob(idc, &rc.RuntimeConfig, "img", "h", "t", "", nil).Spec.Template.Spec,
	} {
		var found bool
		for _, e := range pod.Containers[0].Env {
			if e.Name == envPostgresDSN {
				t.Errorf("%s: %s set for a MySQL sink", what, envPostgresDSN)
			}
			if e.Name == envMySQLDSN {
				ref := e.ValueFrom.SecretKeyRef
				found = ref.Name == "orders-mysql" && ref.Key == "dsn" && e.Value == ""
			}
		}
		if !found {
			t.Errorf("%s: no %s from orders-mysql/dsn in %+v", what, envMySQLDSN, pod.Containers[0].Env)
		}
	}
}
