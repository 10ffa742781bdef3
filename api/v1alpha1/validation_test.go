package v1alpha1_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

const sampleDir = "config/samples"

func loadYAML(path string) *unstructured.Unstructured {
	b, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	obj := &unstructured.Unstructured{}
	Expect(yaml.Unmarshal(b, &obj.Object)).To(Succeed())
	return obj
}

// base is a valid resource (the JetStream/upsert sample) with a fresh name.
func base() *unstructured.Unstructured {
	obj := loadYAML(filepath.Join(testenv.RepoRoot(), sampleDir, "messaging_v1alpha1_idempotentconsumer_jetstream_upsert.yaml"))
	obj.SetNamespace("default")
	obj.SetName("")
	obj.SetGenerateName("v-")
	return obj
}

// set writes value at a dotted path under the object, creating maps on the
// way; a nil value deletes the field.
func set(obj *unstructured.Unstructured, path string, value any) {
	fields := strings.Split(path, ".")
	if value == nil {
		unstructured.RemoveNestedField(obj.Object, fields...)
		return
	}
	// Round-trip through JSON so the value has unstructured's types.
	b, err := json.Marshal(value)
	Expect(err).NotTo(HaveOccurred())
	var v any
	Expect(json.Unmarshal(b, &v)).To(Succeed())
	Expect(unstructured.SetNestedField(obj.Object, v, fields...)).To(Succeed())
}

type m = map[string]any

var validKafka = m{"bootstrapServers": []string{"k:9092"}, "topics": []string{"t"}, "consumerGroup": "g"}

var _ = Describe("samples", func() {
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), sampleDir, "messaging_*.yaml"))

	It("has a sample for every broker and every effect kind", func() {
		var all strings.Builder
		for _, f := range files {
			b, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			all.Write(b)
		}
		for _, want := range []string{"natsJetStream:", "kafka:", "rabbitmq:", "redisStreams:", "upsert:", "append:", "sql:", "http:", "emit:", "postgres:", "mysql:"} {
			Expect(all.String()).To(ContainSubstring(want))
		}
	})

	It("has a MySQL sample for every effect kind", func() {
		covered := map[string]bool{}
		for _, f := range files {
			obj := loadYAML(f)
			if _, ok, _ := unstructured.NestedMap(obj.Object, "spec", "sink", "mysql"); !ok {
				continue
			}
			effect, _, _ := unstructured.NestedMap(obj.Object, "spec", "sink", "effect")
			for kind := range effect {
				covered[kind] = true
			}
		}
		Expect(covered).To(HaveKey("upsert"))
		Expect(covered).To(HaveKey("append"))
		Expect(covered).To(HaveKey("sql"))
		Expect(covered).To(HaveKey("http"))
	})

	for _, f := range files {
		It("accepts "+filepath.Base(f), func() {
			obj := loadYAML(f)
			obj.SetNamespace("default")
			Expect(k8sClient.Create(ctx, obj)).To(Succeed())
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
		})
	}

	It("applies the documented defaults", func() {
		obj := base()
		set(obj, "spec.delivery", nil)
		set(obj, "spec.retention", nil)
		set(obj, "spec.runtime", nil)
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
		got, _, _ := unstructured.NestedInt64(obj.Object, "spec", "delivery", "batchSize")
		Expect(got).To(Equal(int64(500)))
		mode, _, _ := unstructured.NestedString(obj.Object, "spec", "retention", "mode")
		Expect(mode).To(Equal("Derived"))
		sched, _, _ := unstructured.NestedString(obj.Object, "spec", "retention", "prune", "schedule")
		Expect(sched).To(Equal("*/30 * * * *"))
		replicas, _, _ := unstructured.NestedInt64(obj.Object, "spec", "runtime", "replicas")
		Expect(replicas).To(Equal(int64(1)))
		policy, _, _ := unstructured.NestedString(obj.Object, "spec", "sink", "inbox", "deletionPolicy")
		Expect(policy).To(Equal("Retain"))
	})
})

var _ = Describe("invalid resources", func() {
	type invalid struct {
		mutate func(*unstructured.Unstructured)
		// field is the path the rejection must name; want is part of the reason.
		field, want string
	}
	cases := map[string]invalid{
		"no source": {func(o *unstructured.Unstructured) { set(o, "spec.source", m{}) },
			"spec.source", "exactly one of natsJetStream, kafka, rabbitmq, redisStreams"},
		"two sources": {func(o *unstructured.Unstructured) { set(o, "spec.source.kafka", validKafka) },
			"spec.source", "exactly one of natsJetStream, kafka, rabbitmq, redisStreams"},
		"no effect": {func(o *unstructured.Unstructured) { set(o, "spec.sink.effect", m{}) },
			"spec.sink.effect", "exactly one of upsert, append, sql, http"},
		"two effects": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.append", m{"table": "t", "columns": m{"a": "$.a"}})
		}, "spec.sink.effect", "exactly one of upsert, append, sql, http"},
		"no message id form": {func(o *unstructured.Unstructured) { set(o, "spec.message.id", m{}) },
			"spec.message.id", "exactly one of header, jsonPath, brokerNative"},
		"two message id forms": {func(o *unstructured.Unstructured) { set(o, "spec.message.id.jsonPath", "$.id") },
			"spec.message.id", "exactly one of header, jsonPath, brokerNative"},
		"entity key with two forms": {func(o *unstructured.Unstructured) { set(o, "spec.message.entity.key.header", "Key") },
			"spec.message.entity.key", "exactly one of header, jsonPath"},
		"entity without sequence": {func(o *unstructured.Unstructured) { set(o, "spec.message.entity.sequence", nil) },
			"spec.message.entity.sequence", "Required value"},
		"id jsonPath without $.": {func(o *unstructured.Unstructured) {
			set(o, "spec.message.id", m{"jsonPath": "eventId"})
		}, "spec.message.id.jsonPath", "should match"},
		"Explicit without window": {func(o *unstructured.Unstructured) { set(o, "spec.retention.mode", "Explicit") },
			"spec.retention.window", "window is required when mode is Explicit"},
		"window with Derived": {func(o *unstructured.Unstructured) { set(o, "spec.retention.window", "24h") },
			"spec.retention.window", "window may only be set when mode is Explicit"},
		"zero window": {func(o *unstructured.Unstructured) {
			set(o, "spec.retention.mode", "Explicit")
			set(o, "spec.retention.window", "0s")
		}, "spec.retention.window", "window must be positive"},
		"inbox table with capitals": {func(o *unstructured.Unstructured) { set(o, "spec.sink.inbox.table", "Inbox-Orders") },
			"spec.sink.inbox.table", "should match '^[a-z_][a-z0-9_]{0,63}$'"},
		"schema starting with a digit": {func(o *unstructured.Unstructured) { set(o, "spec.sink.postgres.schema", "1projections") },
			"spec.sink.postgres.schema", "should match"},
		"SQL injection in a table name": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.table", "orders; drop table users")
		}, "spec.sink.effect.upsert.table", "should match"},
		"identifier longer than 63 on PostgreSQL": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.inbox.table", strings.Repeat("a", 64))
		}, "spec.sink.inbox.table", "table must be at most 63 characters on PostgreSQL"},
		"identifier longer than 64": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.inbox.table", strings.Repeat("a", 65))
		}, "spec.sink.inbox.table", "Too long"},
		"upsert key not among columns": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.key", []string{"customer_id"})
		}, "spec.sink.effect.upsert", "every key column must be among columns"},
		"sequenceColumn not among columns": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.sequenceColumn", "seq")
		}, "spec.sink.effect.upsert", "sequenceColumn must be among columns"},
		"column name with a space": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.columns.order id", "$.x")
		}, "spec.sink.effect.upsert.columns", "column names must match"},
		"column value that is not an expression": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.columns.status", "status")
		}, "spec.sink.effect.upsert.columns.status", "should match"},
		"sql parameter name": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"sql": m{"statement": "SELECT 1", "params": m{"Bad-Name": "$.a"}}})
		}, "spec.sink.effect.sql.params", "parameter names must match"},
		"http url not http(s)": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"http": m{"url": "ftp://billing/charge"}})
		}, "spec.sink.effect.http.url", "url must be an http:// or https:// URL"},
		"http method GET": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"http": m{"url": "https://billing/charge", "method": "GET"}})
		}, "spec.sink.effect.http.method", "Unsupported value"},
		"batchSize zero": {func(o *unstructured.Unstructured) { set(o, "spec.delivery.batchSize", 0) },
			"spec.delivery.batchSize", "should be greater than or equal to 1"},
		"batchSize too large": {func(o *unstructured.Unstructured) { set(o, "spec.delivery.batchSize", 100000) },
			"spec.delivery.batchSize", "should be less than or equal to 10000"},
		"maxAttempts zero": {func(o *unstructured.Unstructured) { set(o, "spec.delivery.maxAttempts", 0) },
			"spec.delivery.maxAttempts", "should be greater than or equal to 1"},
		"maxWait zero": {func(o *unstructured.Unstructured) { set(o, "spec.delivery.maxWait", "0s") },
			"spec.delivery.maxWait", "maxWait must be positive"},
		"maxWait not a duration": {func(o *unstructured.Unstructured) { set(o, "spec.delivery.maxWait", "soon") },
			"spec.delivery.maxWait", "should match"},
		"backoff max below initial": {func(o *unstructured.Unstructured) {
			set(o, "spec.delivery.backoff", m{"initial": "10s", "max": "1s"})
		}, "spec.delivery.backoff", "backoff.max must not be smaller than backoff.initial"},
		"dead-letter table name": {func(o *unstructured.Unstructured) {
			set(o, "spec.delivery.deadLetter", m{"table": "dead letters"})
		}, "spec.delivery.deadLetter.table", "should match"},
		"replicas above the maximum": {func(o *unstructured.Unstructured) { set(o, "spec.runtime.replicas", 1000) },
			"spec.runtime.replicas", "should be less than or equal to 100"},
		"unknown inbox layout": {func(o *unstructured.Unstructured) { set(o, "spec.sink.inbox.layout", "Sharded") },
			"spec.sink.inbox.layout", "Unsupported value"},
		"unknown deletion policy": {func(o *unstructured.Unstructured) { set(o, "spec.sink.inbox.deletionPolicy", "Orphan") },
			"spec.sink.inbox.deletionPolicy", "Unsupported value"},
		"prune schedule not cron": {func(o *unstructured.Unstructured) { set(o, "spec.retention.prune.schedule", "every minute") },
			"spec.retention.prune.schedule", "schedule must be a five-field cron expression"},
		"prune batchSize zero": {func(o *unstructured.Unstructured) { set(o, "spec.retention.prune.batchSize", 0) },
			"spec.retention.prune.batchSize", "should be greater than or equal to 1"},
		"nats url scheme": {func(o *unstructured.Unstructured) { set(o, "spec.source.natsJetStream.url", "http://nats:4222") },
			"spec.source.natsJetStream.url", "url must start with nats://"},
		"connection secret without key": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.postgres.connectionSecretRef", m{"name": "db"})
		}, "spec.sink.postgres.connectionSecretRef.key", "Required value"},
		"kafka without topics": {func(o *unstructured.Unstructured) {
			set(o, "spec.source", m{"kafka": m{"bootstrapServers": []string{"k:9092"}, "topics": []string{}, "consumerGroup": "g"}})
		}, "spec.source.kafka.topics", "should have at least 1 items"},
		"kafka bootstrap server without port": {func(o *unstructured.Unstructured) {
			set(o, "spec.source", m{"kafka": m{"bootstrapServers": []string{"kafka"}, "topics": []string{"t"}, "consumerGroup": "g"}})
		}, "spec.source.kafka.bootstrapServers[0]", "should match"},
		"kafka SASL mechanism": {func(o *unstructured.Unstructured) {
			k := m{"bootstrapServers": []string{"k:9092"}, "topics": []string{"t"}, "consumerGroup": "g",
				"sasl": m{"mechanism": "GSSAPI", "usernameSecretRef": m{"name": "u", "key": "u"}, "passwordSecretRef": m{"name": "p", "key": "p"}}}
			set(o, "spec.source", m{"kafka": k})
		}, "spec.source.kafka.sasl.mechanism", "Unsupported value"},
		"rabbitmq prefetch zero": {func(o *unstructured.Unstructured) {
			set(o, "spec.source", m{"rabbitmq": m{"uriSecretRef": m{"name": "r", "key": "uri"}, "queue": "q", "prefetch": 0}})
		}, "spec.source.rabbitmq.prefetch", "should be greater than or equal to 1"},
		"upsert table equal to the inbox table": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.table", "inbox_orders_projector")
		}, "spec.sink.effect.upsert.table", "must not be the inbox table or the dead-letter table"},
		"upsert table equal to the default dead-letter table": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect.upsert.table", "inbox_orders_projector_dead_letters")
		}, "spec.sink.effect.upsert.table", "must not be the inbox table or the dead-letter table"},
		"append table equal to the declared dead-letter table": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"append": m{"table": "failed", "columns": m{"a": "$.a"}}})
			set(o, "spec.delivery.deadLetter", m{"table": "failed"})
		}, "spec.sink.effect.append.table", "must not be the inbox table or the dead-letter table"},
		"dead-letter table equal to the inbox table": {func(o *unstructured.Unstructured) {
			set(o, "spec.delivery.deadLetter", m{"table": "inbox_orders_projector"})
		}, "spec.delivery.deadLetter.table", "the dead-letter table must not be the inbox table"},
		"schema pg_catalog": {func(o *unstructured.Unstructured) { set(o, "spec.sink.postgres.schema", "pg_catalog") },
			"spec.sink.postgres.schema", "must not be a system schema"},
		"schema information_schema": {func(o *unstructured.Unstructured) { set(o, "spec.sink.postgres.schema", "information_schema") },
			"spec.sink.postgres.schema", "must not be a system schema"},
		"schema with the pg_ prefix": {func(o *unstructured.Unstructured) { set(o, "spec.sink.postgres.schema", "pg_toast") },
			"spec.sink.postgres.schema", "must not be a system schema"},
		"http url with credentials": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"http": m{"url": "https://svc:s3cret@billing/charge"}})
		}, "spec.sink.effect.http.url", "must not carry credentials"},
		"nats url with credentials": {func(o *unstructured.Unstructured) {
			set(o, "spec.source.natsJetStream.url", "nats://user:s3cret@nats:4222")
		}, "spec.source.natsJetStream.url", "must not carry credentials"},
		"nats url list with credentials in the second": {func(o *unstructured.Unstructured) {
			set(o, "spec.source.natsJetStream.url", "nats://a:4222,nats://token@b:4222")
		}, "spec.source.natsJetStream.url", "must not carry credentials"},
		"rabbitmq managementURL with credentials": {func(o *unstructured.Unstructured) {
			set(o, "spec.source", m{"rabbitmq": m{"uriSecretRef": m{"name": "r", "key": "uri"}, "queue": "q", "managementURL": "http://guest:guest@rabbit:15672"}})
		}, "spec.source.rabbitmq.managementURL", "must not carry credentials"},
		"sql statement with two commands": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"sql": m{"statement": "UPDATE a SET n = :n; DELETE FROM a", "params": m{"n": "$.n"}}})
		}, "spec.sink.effect.sql.statement", "exactly one command"},
		"sql statement with a command after a quoted ';'": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"sql": m{"statement": "UPDATE a SET s = ';' WHERE id = :id;DROP TABLE a", "params": m{"id": "$.id"}}})
		}, "spec.sink.effect.sql.statement", "exactly one command"},
		"emit without a target": {func(o *unstructured.Unstructured) { set(o, "spec.emit", m{"when": "Always"}) },
			"spec.emit", "exactly one emit target must be set"},
		"emit url with credentials": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://user:secret@nats:4222", "subject": "out"}})
		}, "spec.emit.natsJetStream.url", "must not carry credentials"},
		"emit url scheme": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "http://nats:4222", "subject": "out"}})
		}, "spec.emit.natsJetStream.url", "url must start with nats://"},
		"emit subject with a wildcard": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out.>"}})
		}, "spec.emit.natsJetStream.subject", "should match"},
		"emit without subject": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222"}})
		}, "spec.emit.natsJetStream.subject", "Required value"},
		"emit when unknown": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}, "when": "Sometimes"})
		}, "spec.emit.when", "Unsupported value"},
		"emit payload value not an expression": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}, "payload": m{"status": "status"}})
		}, "spec.emit.payload.status", "should match"},
		"emit with two targets": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}, "redisStreams": m{"address": "r:6379", "stream": "s"}})
		}, "spec.emit", "exactly one emit target must be set"},
		"emit kafka without topic": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"kafka": m{"bootstrapServers": []string{"k:9092"}}})
		}, "spec.emit.kafka.topic", "Required value"},
		"emit kafka server without port": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"kafka": m{"bootstrapServers": []string{"kafka"}, "topic": "t"}})
		}, "spec.emit.kafka.bootstrapServers[0]", "should match"},
		"emit rabbitmq default exchange without routing key": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"rabbitmq": m{"uriSecretRef": m{"name": "r", "key": "uri"}}})
		}, "spec.emit.rabbitmq.routingKey", "routingKey is required with the default exchange"},
		"emit rabbitmq without uri secret": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"rabbitmq": m{"exchange": "events", "routingKey": "x"}})
		}, "spec.emit.rabbitmq.uriSecretRef", "Required value"},
		"emit redis address without port": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"redisStreams": m{"address": "redis", "stream": "s"}})
		}, "spec.emit.redisStreams.address", "should match"},
		"emit with the http effect": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"http": m{"url": "https://billing/charge"}})
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}})
		}, "spec.emit", "emit is not supported with the http effect"},
		"redis address without port": {func(o *unstructured.Unstructured) {
			set(o, "spec.source", m{"redisStreams": m{"address": "redis", "stream": "s", "group": "g"}})
		}, "spec.source.redisStreams.address", "should match"},
		"http delivery unknown": {func(o *unstructured.Unstructured) {
			set(o, "spec.sink.effect", m{"http": m{"url": "https://billing/charge", "delivery": "Later"}})
		}, "spec.sink.effect.http.delivery", "Unsupported value"},
		"emit header name with a space": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}, "headers": m{"Order Status": "$.status"}})
		}, "spec.emit.headers", "header names must be 1 to 255 letters"},
		"emit header the runtime sets": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}, "headers": m{"Nats-Msg-Id": "$.id"}})
		}, "spec.emit.headers", "Idc-Event-Id and Nats-* headers are set by the runtime"},
		"emit header value not an expression": {func(o *unstructured.Unstructured) {
			set(o, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"}, "headers": m{"X-Status": "status"}})
		}, "spec.emit.headers.X-Status", "should match"},
	}

	for name, c := range cases {
		It("rejects "+name+", naming "+c.field, func() {
			obj := base()
			c.mutate(obj)
			err := k8sClient.Create(ctx, obj)
			Expect(err).To(HaveOccurred(), "the API server accepted an invalid resource")
			Expect(err.Error()).To(ContainSubstring(c.field))
			Expect(err.Error()).To(ContainSubstring(c.want))
		})
	}

	It("has at least 25 invalid cases", func() {
		Expect(len(cases)).To(BeNumerically(">=", 25))
	})

	immutable := map[string]struct {
		prepare func(*unstructured.Unstructured)
		field   string
		value   any
	}{
		"inbox table":          {nil, "spec.sink.inbox.table", "inbox_other"},
		"postgres schema":      {nil, "spec.sink.postgres.schema", "other"},
		"JetStream consumer":   {nil, "spec.source.natsJetStream.consumer", "other"},
		"Kafka consumer group": {func(o *unstructured.Unstructured) { set(o, "spec.source", m{"kafka": validKafka}) }, "spec.source.kafka.consumerGroup", "other"},
		"Redis consumer group": {func(o *unstructured.Unstructured) {
			set(o, "spec.source", m{"redisStreams": m{"address": "r:6379", "stream": "s", "group": "g"}})
		}, "spec.source.redisStreams.group", "other"},
	}
	for name, c := range immutable {
		It("refuses to change the "+name, func() {
			obj := base()
			if c.prepare != nil {
				c.prepare(obj)
			}
			Expect(k8sClient.Create(ctx, obj)).To(Succeed())
			DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
			set(obj, c.field, c.value)
			err := k8sClient.Update(ctx, obj)
			Expect(err).To(HaveOccurred())
			Expect(err.Error()).To(ContainSubstring(c.field))
			Expect(err.Error()).To(ContainSubstring("is immutable"))
		})
	}

	It("accepts one sql command with ';' only in literals, identifiers or at the end, and URLs whose '@' is not user info", func() {
		for _, stmt := range []string{
			"UPDATE a SET s = 'x;y' WHERE id = :id",
			`UPDATE "odd;name" SET n = n + 1 WHERE id = :id;`,
			"UPDATE a SET s = 'it''s; fine' WHERE id = :id ;  ",
		} {
			obj := base()
			set(obj, "spec.sink.effect", m{"sql": m{"statement": stmt, "params": m{"id": "$.id"}}})
			Expect(k8sClient.Create(ctx, obj)).To(Succeed(), stmt)
			DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
		}
		obj := base()
		set(obj, "spec.sink.effect", m{"http": m{"url": "https://billing/charge?by=ops@example.com"}})
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
	})

	It("accepts every emit target, credentials only as Secret references", func() {
		for _, target := range []m{
			{"natsJetStream": m{"url": "tls://nats:4222", "subject": "order-projected.v1",
				"credentialsSecretRef": m{"name": "nats", "key": "creds"}, "tls": m{"caSecretRef": m{"name": "ca", "key": "ca.crt"}}}},
			{"kafka": m{"bootstrapServers": []string{"k1:9092", "k2:9092"}, "topic": "order-projected",
				"sasl": m{"mechanism": "SCRAM-SHA-512", "usernameSecretRef": m{"name": "k", "key": "user"}, "passwordSecretRef": m{"name": "k", "key": "pass"}}}},
			{"rabbitmq": m{"uriSecretRef": m{"name": "r", "key": "uri"}, "exchange": "events", "routingKey": "order.projected"}},
			{"rabbitmq": m{"uriSecretRef": m{"name": "r", "key": "uri"}, "routingKey": "order-projected"}},
			{"redisStreams": m{"address": "redis:6379", "stream": "order-projected", "passwordSecretRef": m{"name": "redis", "key": "password"}}},
		} {
			obj := base()
			set(obj, "spec.emit", target)
			Expect(k8sClient.Create(ctx, obj)).To(Succeed(), "%v", target)
			DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
		}
	})

	It("accepts emit headers and the http effect with delivery Outbox, and defaults delivery to Inline", func() {
		obj := base()
		set(obj, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "out"},
			"headers": m{"Order-Status": "$.status", "X-Source.Id": "@messageId"}})
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
		for _, delivery := range []string{"", "Inline", "Outbox"} {
			obj := base()
			http := m{"url": "https://billing/charge"}
			if delivery != "" {
				http["delivery"] = delivery
			}
			set(obj, "spec.sink.effect", m{"http": http})
			Expect(k8sClient.Create(ctx, obj)).To(Succeed(), "delivery %q", delivery)
			DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
			got, _, _ := unstructured.NestedString(obj.Object, "spec", "sink", "effect", "http", "delivery")
			Expect(got).To(Equal(map[string]string{"": "Inline"}[delivery] + delivery))
		}
	})

	It("accepts an emit with only a target and defaults when to Always", func() {
		obj := base()
		set(obj, "spec.emit", m{"natsJetStream": m{"url": "nats://nats:4222", "subject": "order-projected"}})
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
		when, _, _ := unstructured.NestedString(obj.Object, "spec", "emit", "when")
		Expect(when).To(Equal("Always"))
	})

	It("still allows changing mutable fields", func() {
		obj := base()
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })
		set(obj, "spec.delivery.batchSize", 1000)
		set(obj, "spec.suspend", true)
		Expect(k8sClient.Update(ctx, obj)).To(Succeed())
	})
})

var _ = Describe("printer columns", func() {
	It("shows Ready, Source, Window, Last Prune and Age in the API server's Table output", func() {
		obj := base()
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, obj)).To(Succeed()) })

		pruned := metav1.Date(2026, 11, 30, 12, 0, 0, 0, metav1.Now().Location())
		status := m{"status": m{
			"source":     "NATSJetStream ORDERS/orders-projector",
			"conditions": []m{{"type": "Ready", "status": "True", "reason": "Ready", "message": "ok", "lastTransitionTime": "2026-11-30T12:00:00Z"}},
			"retention":  m{"window": "193h"},
			"lastPrune":  m{"time": pruned.UTC().Format("2006-01-02T15:04:05Z")},
		}}
		patch, err := json.Marshal(status)
		Expect(err).NotTo(HaveOccurred())
		Expect(k8sClient.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, patch))).To(Succeed())

		cs, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		raw, err := cs.RESTClient().Get().
			AbsPath("/apis/messaging.idempotency.dev/v1alpha1/namespaces/default/idempotentconsumers", obj.GetName()).
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
			Do(ctx).Raw()
		Expect(err).NotTo(HaveOccurred())
		var table metav1.Table
		Expect(json.Unmarshal(raw, &table)).To(Succeed())

		var names []string
		for _, c := range table.ColumnDefinitions {
			if c.Priority == 0 {
				names = append(names, c.Name)
			}
		}
		Expect(names).To(Equal([]string{"Name", "Ready", "Source", "Window", "Last Prune", "Age"}))
		Expect(table.Rows).To(HaveLen(1))
		cells := table.Rows[0].Cells
		Expect(cells[0]).To(Equal(obj.GetName()))
		Expect(cells[1]).To(Equal("True"))
		Expect(cells[2]).To(Equal("NATSJetStream ORDERS/orders-projector"))
		Expect(cells[3]).To(Equal("193h"))
		Expect(fmt.Sprint(cells[4])).NotTo(BeEmpty())
		Expect(fmt.Sprint(cells[5])).NotTo(BeEmpty())
	})
})
