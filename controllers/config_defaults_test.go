package controllers

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

// crdFile is the generated CRD (make manifests); the Helm chart carries a copy.
const crdFile = "config/crd/bases/messaging.idempotency.dev_idempotentconsumers.yaml"

// crdOnlyDefaults are the CRD defaults with no default in the runtime config
// or the controller: the value comes from the spec only, so there is
// nothing for it to disagree with. A new default must be listed here or
// compared in TestCRDDefaultsMatchRuntimeConfig.
var crdOnlyDefaults = map[string]string{
	"spec.retention.maxConsumerOutage": "the runtime reads it from the spec (zero would allow no outage)",
	"spec.retention.safetyMargin":      "the runtime reads it from the spec (zero adds no margin)",
	"spec.retention.prune.schedule":    "passed through to the prune CronJob",
	// spec.runtime.autoscaling: passed through to KEDA's ScaledObject; the
	// runtime config has no autoscaling.
	"spec.runtime.autoscaling.minReplicas":            "passed through to the ScaledObject's minReplicaCount",
	"spec.runtime.autoscaling.activationLag":          "passed through to the scaler's activation threshold",
	"spec.runtime.autoscaling.pollingInterval":        "passed through to the ScaledObject",
	"spec.runtime.autoscaling.cooldownPeriod":         "passed through to the ScaledObject",
	"spec.runtime.autoscaling.scaleDownStabilization": "passed through to the HPA behavior of the ScaledObject",
	"spec.runtime.autoscaling.natsAccount":            "passed through to the nats-jetstream scaler",
}

// TestCRDDefaultsMatchRuntimeConfig reads every default of the generated CRD
// and compares it with the default the runtime config (config.Default, as
// renderConfig applies it) or the controller gives the same field when the
// spec leaves it empty, e.g. a resource written without the API server's
// defaulting. A default changed on one side only fails here, naming the field.
func TestCRDDefaultsMatchRuntimeConfig(t *testing.T) {
	crd := crdDefaults(t)
	runtimeDefaults := renderedDefaults(t)

	paths := make([]string, 0, len(crd))
	for p := range crd {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	compared := 0
	for _, path := range paths {
		want := crd[path]
		if _, ok := crdOnlyDefaults[path]; ok {
			continue
		}
		got, ok := runtimeDefaults[path]
		if !ok {
			t.Errorf("%s: the CRD defaults it to %v, but this test does not know the runtime's default: compare it in renderedDefaults or list it in crdOnlyDefaults", path, want)
			continue
		}
		if err := sameDefault(want, got); err != nil {
			t.Errorf("%s: the CRD default %v differs from the runtime config's %v: %v", path, want, got, err)
		}
		compared++
	}
	for path, got := range runtimeDefaults {
		if _, ok := crd[path]; !ok {
			t.Errorf("%s: the runtime defaults it to %v but the CRD has no default for it", path, got)
		}
	}
	for path := range crdOnlyDefaults {
		if _, ok := crd[path]; !ok {
			t.Errorf("%s is listed in crdOnlyDefaults but the CRD has no default for it", path)
		}
	}
	t.Logf("compared %d CRD defaults with the runtime config's; %d are CRD-only", compared, len(crdOnlyDefaults))
	if compared < 15 {
		t.Errorf("compared only %d defaults: is %s still the CRD?", compared, crdFile)
	}
}

// crdDefaults walks the CRD's schema and returns the defaults by dotted
// path ("spec.delivery.batchSize"). An empty-object default ({}, which only
// lets the nested defaults apply) is not a value of its own.
func crdDefaults(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), crdFile))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Spec.Versions) != 1 || doc.Spec.Versions[0].Name != "v1alpha1" {
		t.Fatalf("expected the one version v1alpha1 in %s", crdFile)
	}
	out := map[string]any{}
	var walk func(path string, schema map[string]any)
	walk = func(path string, schema map[string]any) {
		if d, ok := schema["default"]; ok {
			if m, isMap := d.(map[string]any); !isMap || len(m) > 0 {
				out[path] = d
			}
		}
		if props, ok := schema["properties"].(map[string]any); ok {
			for name, sub := range props {
				p := name
				if path != "" {
					p = path + "." + name
				}
				walk(p, sub.(map[string]any))
			}
		}
		if items, ok := schema["items"].(map[string]any); ok {
			walk(path+"[]", items)
		}
		if ap, ok := schema["additionalProperties"].(map[string]any); ok {
			walk(path+".*", ap)
		}
	}
	walk("", doc.Spec.Versions[0].Schema.OpenAPIV3Schema)
	return out
}

// renderedDefaults renders resources that leave every defaulted field
// empty and returns what the runtime config (or the controller) filled in,
// by the CRD path of the field.
func renderedDefaults(t *testing.T) map[string]any {
	t.Helper()
	render := func(spec messagingv1alpha1.IdempotentConsumerSpec) *config.Config {
		t.Helper()
		rc, err := renderConfig(&messagingv1alpha1.IdempotentConsumer{Spec: spec})
		if err != nil {
			t.Fatalf("rendering a spec without defaults: %v", err)
		}
		return rc.Config
	}
	ref := messagingv1alpha1.SecretKeyRef{Name: "s", Key: "k"}
	base := func() messagingv1alpha1.IdempotentConsumerSpec {
		return messagingv1alpha1.IdempotentConsumerSpec{
			Message: messagingv1alpha1.MessageSpec{ID: messagingv1alpha1.IDSpec{Header: "Nats-Msg-Id"}},
			Sink: messagingv1alpha1.SinkSpec{
				Postgres: &messagingv1alpha1.PostgresSpec{ConnectionSecretRef: ref},
				Inbox:    messagingv1alpha1.InboxSpec{Table: "inbox_defaults"},
			},
		}
	}
	// JetStream, upsert and emit.
	a := base()
	a.Source.NATSJetStream = &messagingv1alpha1.NATSJetStreamSource{URL: "nats://n:4222", Stream: "S", Consumer: "c"}
	a.Sink.Effect.Upsert = &messagingv1alpha1.UpsertEffect{Table: "t", Key: []messagingv1alpha1.SQLIdentifier{"k"},
		Columns: messagingv1alpha1.Columns{"k": "$.k"}}
	a.Emit = &messagingv1alpha1.EmitSpec{NATSJetStream: &messagingv1alpha1.NATSJetStreamEmit{URL: "nats://n:4222", Subject: "out"}}
	ca := render(a)
	// Redis Streams and http.
	b := base()
	b.Source.RedisStreams = &messagingv1alpha1.RedisStreamsSource{Address: "r:6379", Stream: "s", Group: "g"}
	b.Sink.Effect.HTTP = &messagingv1alpha1.HTTPEffect{URL: "https://h/x"}
	cb := render(b)
	mode := ca.Retention.Mode
	if mode == "" {
		mode = retention.ModeDerived // the runtime reads an empty mode as Derived (retention.Spec)
	}

	return map[string]any{
		"spec.delivery.batchSize":               ca.Delivery.BatchSize,
		"spec.delivery.maxWait":                 ca.Delivery.MaxWait.Duration,
		"spec.delivery.maxAttempts":             ca.Delivery.MaxAttempts,
		"spec.delivery.inFlight":                ca.Delivery.InFlight,
		"spec.delivery.batching":                string(ca.Delivery.Batching),
		"spec.delivery.backoff.initial":         ca.Delivery.BackoffInitial.Duration,
		"spec.delivery.backoff.max":             ca.Delivery.BackoffMax.Duration,
		"spec.runtime.replicas":                 ca.Delivery.Replicas,
		"spec.retention.prune.batchSize":        ca.Retention.PruneBatchSize,
		"spec.retention.prune.maxDuration":      ca.Retention.PruneMaxDuration.Duration,
		"spec.retention.mode":                   mode,
		"spec.sink.postgres.schema":             ca.Sink.Schema,
		"spec.sink.inbox.layout":                string(ca.Sink.Layout),
		"spec.message.id.onPayloadMismatch":     ca.Message.OnPayloadMismatch,
		"spec.emit.when":                        ca.Emit.When,
		"spec.sink.effect.http.method":          cb.Sink.Effect.HTTP.Method,
		"spec.sink.effect.http.timeout":         cb.Sink.Effect.HTTP.Timeout.Duration,
		"spec.sink.effect.http.delivery":        cb.Sink.Effect.HTTP.Delivery,
		"spec.source.redisStreams.bodyField":    cb.Source.RedisStreams.BodyField,
		"spec.source.redisStreams.claimMinIdle": cb.Source.RedisStreams.ClaimMinIdle.Duration,
		// The controller adds the drop finalizer only for Delete, so an empty
		// policy keeps the tables.
		"spec.sink.inbox.deletionPolicy": string(messagingv1alpha1.DeletionPolicyRetain),
	}
}

// sameDefault compares a CRD default (as decoded from YAML: a number or a
// string) with the runtime's value of that field.
func sameDefault(crd, runtime any) error {
	switch r := runtime.(type) {
	case int:
		n, ok := crd.(float64)
		if !ok || n != float64(r) {
			return fmt.Errorf("want the integer %d", r)
		}
	case time.Duration:
		s, ok := crd.(string)
		if !ok {
			return fmt.Errorf("want a duration string")
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if d != r {
			return fmt.Errorf("%s is not %s", d, r)
		}
	case string:
		if s, ok := crd.(string); !ok || s != r {
			return fmt.Errorf("want %q", r)
		}
	default:
		return fmt.Errorf("unexpected runtime type %T", runtime)
	}
	return nil
}
