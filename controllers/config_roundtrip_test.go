package controllers

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// notInRuntimeConfig are the spec fields that intentionally do not reach
// the runtime config, each with where it goes instead. A field of the spec
// that is neither here nor in the rendered config fails
// TestEverySpecFieldReachesTheRuntimeConfig.
var notInRuntimeConfig = map[string]string{
	"Spec.Suspend":                                    "scales the Deployment to 0 (children phase), the runtime is not told",
	"Spec.Sink.Inbox.DeletionPolicy":                  "the drop-inbox finalizer (finalizer phase, delete.go)",
	"Spec.Retention.Prune.Schedule":                   "the prune CronJob's schedule (internal/specs)",
	"Spec.Retention.Prune.Suspend":                    "the prune CronJob's suspend (internal/specs)",
	"Spec.Runtime.Image":                              "the pods' image (internal/specs)",
	"Spec.Runtime.Resources":                          "the runtime container's resources (internal/specs)",
	"Spec.Runtime.ServiceAccountName":                 "the pods' service account (internal/specs)",
	"Spec.Runtime.PodAnnotations":                     "the pod templates' annotations (internal/specs)",
	"Spec.Runtime.NodeSelector":                       "pod placement (internal/specs)",
	"Spec.Runtime.Affinity":                           "pod placement (internal/specs)",
	"Spec.Runtime.Tolerations":                        "pod placement (internal/specs)",
	"Spec.Runtime.TopologySpreadConstraints":          "pod placement (internal/specs)",
	"Spec.Runtime.PriorityClassName":                  "pod placement (internal/specs)",
	"Spec.Runtime.Autoscaling.MinReplicas":            "KEDA's ScaledObject (internal/specs)",
	"Spec.Runtime.Autoscaling.LagPerReplica":          "KEDA's trigger (internal/specs)",
	"Spec.Runtime.Autoscaling.ActivationLag":          "KEDA's trigger (internal/specs)",
	"Spec.Runtime.Autoscaling.PollingInterval":        "KEDA's ScaledObject (internal/specs)",
	"Spec.Runtime.Autoscaling.CooldownPeriod":         "KEDA's ScaledObject (internal/specs)",
	"Spec.Runtime.Autoscaling.ScaleDownStabilization": "the HPA behaviour in KEDA's ScaledObject (internal/specs)",
	"Spec.Runtime.Autoscaling.NATSMonitoringURL":      "KEDA's nats-jetstream trigger (internal/specs)",
	"Spec.Runtime.Autoscaling.NATSAccount":            "KEDA's nats-jetstream trigger (internal/specs)",
}

// whileNotAutoscaled are the fields that reach the config only without
// spec.runtime.autoscaling (under it, delivery.replicas is maxReplicas).
var whileNotAutoscaled = map[string]bool{"Spec.Runtime.Replicas": true}

// setOnly are the fields with no second valid value (a one-of branch that
// is a bool: false would leave the one-of empty): the rendered config is
// asked for them directly.
var setOnly = map[string]func(*renderedConfig) bool{
	"Spec.Message.ID.BrokerNative": func(rc *renderedConfig) bool { return rc.Config.Message.ID.BrokerNative },
}

// variants of the filled spec: each sets other branches of the one-ofs.
// The http effect (variant 3) takes no emit target (the runtime refuses
// the pair), so variant 4 sets the last emit target.
const variants = 5

// branch is the one-of branch a variant sets, -1 for none.
func branch(t reflect.Type, variant, branches int) int {
	if t == reflect.TypeFor[messagingv1alpha1.EmitSpec]() {
		return []int{0, 1, 2, -1, 3}[variant]
	}
	return variant % branches
}

// emitless says whether the variant leaves spec.emit out.
func emitless(at string, variant int) bool {
	return at == "Spec.Emit" && branch(reflect.TypeFor[messagingv1alpha1.EmitSpec](), variant, 4) < 0
}

// oneOf are the API types of which exactly one field of the listed ones is
// set; each variant of the test sets another.
var oneOf = map[reflect.Type][]string{
	reflect.TypeFor[messagingv1alpha1.SourceSpec]():    {"NATSJetStream", "Kafka", "RabbitMQ", "RedisStreams"},
	reflect.TypeFor[messagingv1alpha1.SinkSpec]():      {"Postgres", "MySQL"},
	reflect.TypeFor[messagingv1alpha1.EffectSpec]():    {"Upsert", "Append", "SQL", "HTTP"},
	reflect.TypeFor[messagingv1alpha1.EmitSpec]():      {"NATSJetStream", "Kafka", "RabbitMQ", "RedisStreams"},
	reflect.TypeFor[messagingv1alpha1.IDSpec]():        {"Header", "JSONPath", "BrokerNative"},
	reflect.TypeFor[messagingv1alpha1.FieldSpec]():     {"Header", "JSONPath"},
	reflect.TypeFor[messagingv1alpha1.RetentionSpec](): {"Window", "MaxConsumerOutage"},
	// partitions derives each partition's filter: no filterSubject beside it.
	reflect.TypeFor[messagingv1alpha1.NATSJetStreamSource](): {"Partitions", "FilterSubject"},
}

// leafTypes are filled whole, not field by field (core/v1 types, and the
// placement types that copy them).
func isLeaf(t reflect.Type) bool {
	pkg := t.PkgPath()
	return (pkg != "" && pkg != reflect.TypeFor[messagingv1alpha1.IdempotentConsumer]().PkgPath()) ||
		t.Kind() != reflect.Struct
}

// Every field of the spec reaches the runtime config the controller
// renders (or the Secrets it names), unless notInRuntimeConfig says where
// it goes instead: each field is filled with a non-zero value, the spec
// rendered, then the field given another value and the spec rendered
// again; the two configs must differ. Fields under a one-of (a source, an
// effect, an emit target, an id) are checked in the variant that sets
// their branch.
func TestEverySpecFieldReachesTheRuntimeConfig(t *testing.T) {
	checked := map[string]bool{}
	for variant := range variants {
		base := filledConsumer(t, variant, "", 1)
		want := renderedSnapshot(t, base, "base of variant "+fmt.Sprint(variant))
		for _, path := range leafPaths(reflect.TypeFor[messagingv1alpha1.IdempotentConsumerSpec](), "Spec", variant) {
			if _, ok := notInRuntimeConfig[path]; ok {
				checked[path] = true
				continue
			}
			if reached, ok := setOnly[path]; ok {
				rc, err := renderConfig(base)
				if err != nil || !reached(rc) {
					t.Errorf("%s: set, it is not in the rendered runtime config (%v)", path, err)
				}
				checked[path] = true
				continue
			}
			b, changed := base, filledConsumer(t, variant, path, 2)
			if whileNotAutoscaled[path] {
				b = base.DeepCopy()
				b.Spec.Runtime.Autoscaling, changed.Spec.Runtime.Autoscaling = nil, nil
				want = renderedSnapshot(t, b, path+" without autoscaling")
			}
			got := renderedSnapshot(t, changed, path)
			if got == want && !checked[path] {
				t.Errorf("%s: changing it changes nothing in the rendered runtime config; map it in config.go, or list it in notInRuntimeConfig with where it goes", path)
			}
			checked[path] = true
			if whileNotAutoscaled[path] {
				want = renderedSnapshot(t, base, "base of variant "+fmt.Sprint(variant))
			}
		}
	}
	for path := range notInRuntimeConfig {
		if !checked[path] {
			t.Errorf("notInRuntimeConfig lists %s, which is no field of the spec", path)
		}
	}
	// Both sink databases' fields are walked (the variants alternate them).
	for _, path := range []string{"Spec.Sink.Postgres.Schema", "Spec.Sink.Postgres.ConnectionSecretRef.Key", "Spec.Sink.MySQL.Database", "Spec.Sink.MySQL.ConnectionSecretRef.Name"} {
		if !checked[path] {
			t.Errorf("%s was not checked", path)
		}
	}
	t.Logf("%d spec fields checked", len(checked))
	if len(checked) < 60 {
		t.Fatalf("only %d spec fields were checked: the walk is broken", len(checked))
	}
}

// renderedSnapshot is what the runtime receives: the config and the
// Secret keys behind its env variables.
func renderedSnapshot(t *testing.T, idc *messagingv1alpha1.IdempotentConsumer, what string) string {
	t.Helper()
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatalf("%s: the filled spec does not render: %v", what, err)
	}
	secrets, _ := json.Marshal(rc.Secrets)
	return string(rc.JSON) + "\n" + string(secrets)
}

// leafPaths lists the fields of t (dotted, from prefix) that the variant
// fills, down to leaves.
func leafPaths(t reflect.Type, prefix string, variant int) []string {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if _, elsewhere := notInRuntimeConfig[prefix]; elsewhere || isLeaf(t) {
		return []string{prefix}
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || !branchTaken(t, f.Name, variant) || emitless(prefix+"."+f.Name, variant) {
			continue
		}
		out = append(out, leafPaths(f.Type, prefix+"."+f.Name, variant)...)
	}
	return out
}

// branchTaken says whether the variant sets field name of t (always, but
// for the branches of a one-of: the variant's one).
func branchTaken(t reflect.Type, name string, variant int) bool {
	branches, ok := oneOf[t]
	if !ok {
		return true
	}
	for i, b := range branches {
		if b == name {
			return i == branch(t, variant, len(branches))
		}
	}
	return true
}

// filledConsumer is a resource whose spec has every field the variant sets
// filled (seed 1), the field at path with seed 2.
func filledConsumer(t *testing.T, variant int, path string, seed int) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	idc := &messagingv1alpha1.IdempotentConsumer{ObjectMeta: metav1.ObjectMeta{Name: "orders", Namespace: "shop"}}
	fill(t, reflect.ValueOf(&idc.Spec).Elem(), "Spec", variant, path, seed)
	return idc
}

func fill(t *testing.T, v reflect.Value, at string, variant int, path string, seed int) {
	t.Helper()
	s := 1
	if at == path {
		s = seed
	}
	if v.Kind() == reflect.Pointer {
		v.Set(reflect.New(v.Type().Elem()))
		v = v.Elem()
	}
	if _, elsewhere := notInRuntimeConfig[at]; !elsewhere && !isLeaf(v.Type()) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.IsExported() && branchTaken(v.Type(), f.Name, variant) && !emitless(at+"."+f.Name, variant) {
				fill(t, v.Field(i), at+"."+f.Name, variant, path, seed)
			}
		}
		return
	}
	if !fillLeaf(v, at, s) {
		if _, elsewhere := notInRuntimeConfig[at]; elsewhere {
			// A core/v1 type that goes to the pods: left as it is.
			v.Set(reflect.Zero(v.Type()))
			return
		}
		t.Fatalf("%s (%s): the test cannot fill this type; teach fillLeaf", at, v.Type())
	}
}

// fillLeaf sets v to a valid value that differs per seed.
func fillLeaf(v reflect.Value, at string, seed int) bool {
	name := at[strings.LastIndex(at, ".")+1:]
	if strings.HasSuffix(at, "Upsert.Columns") {
		// Both seeds' key and sequence columns are among the columns.
		v.Set(reflect.ValueOf(messagingv1alpha1.Columns{"key_1": "$.k1", "key_2": "$.k2", "sequencecolumn_1": "$.s1", "sequencecolumn_2": "$.s2",
			"value": messagingv1alpha1.ValueExpression(fmt.Sprintf("$.v%d", seed))}))
		return true
	}
	if s, ok := specialValues(at, seed); ok && v.Kind() == reflect.String {
		v.Set(reflect.ValueOf(s).Convert(v.Type()))
		return true
	}
	switch v.Type() {
	case reflect.TypeFor[messagingv1alpha1.Duration]():
		v.SetString(fmt.Sprintf("%dm", 30*seed))
		return true
	case reflect.TypeFor[messagingv1alpha1.SQLIdentifier]():
		v.SetString(fmt.Sprintf("%s_%d", strings.ToLower(name), seed))
		return true
	case reflect.TypeFor[messagingv1alpha1.JSONPath](), reflect.TypeFor[messagingv1alpha1.ValueExpression]():
		v.SetString(fmt.Sprintf("$.%s%d", strings.ToLower(name), seed))
		return true
	}
	if values, ok := enumValues[v.Type()]; ok {
		v.SetString(values[seed-1])
		return true
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("%s-%d", strings.ToLower(name), seed))
	case reflect.Bool:
		v.SetBool(seed == 1)
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(2 + seed))
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		if !fillLeaf(s.Index(0), at, seed) {
			return false
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		if !fillLeaf(k, at+"Key", seed) || !fillLeaf(e, at, seed) {
			return false
		}
		m.SetMapIndex(k, e)
		v.Set(m)
	default:
		return false
	}
	return true
}

// enumValues are two valid values of each enum type of the spec.
var enumValues = map[reflect.Type][2]string{
	reflect.TypeFor[messagingv1alpha1.EmitWhen]():              {"Always", "Changed"},
	reflect.TypeFor[messagingv1alpha1.InboxLayout]():           {"Partitioned", "Table"},
	reflect.TypeFor[messagingv1alpha1.DeletionPolicy]():        {"Delete", "Retain"},
	reflect.TypeFor[messagingv1alpha1.HTTPMethod]():            {"PUT", "POST"},
	reflect.TypeFor[messagingv1alpha1.HTTPDelivery]():          {"Outbox", "Inline"},
	reflect.TypeFor[messagingv1alpha1.Batching]():              {"Fixed", "Adaptive"},
	reflect.TypeFor[messagingv1alpha1.RetentionMode]():         {"Explicit", "Derived"},
	reflect.TypeFor[messagingv1alpha1.KafkaSASLMechanism]():    {"SCRAM-SHA-512", "PLAIN"},
	reflect.TypeFor[messagingv1alpha1.PayloadMismatchPolicy](): {"DeadLetter", "Ignore"},
}

// specialValues are the fields whose value has a form of its own (URLs,
// addresses, a statement that uses its parameters), by path suffix.
func specialValues(at string, seed int) (string, bool) {
	switch {
	case strings.HasSuffix(at, "NATSJetStream.URL"):
		return fmt.Sprintf("nats://nats-%d:4222", seed), true
	case strings.HasSuffix(at, "ManagementURL"), strings.HasSuffix(at, "NATSMonitoringURL"):
		return fmt.Sprintf("http://mgmt-%d:15672", seed), true
	case strings.HasSuffix(at, "HTTP.URL"):
		return fmt.Sprintf("https://effect-%d.example/apply", seed), true
	case strings.HasSuffix(at, ".Address"):
		return fmt.Sprintf("redis-%d:6379", seed), true
	case strings.HasSuffix(at, "BootstrapServers"):
		return fmt.Sprintf("kafka-%d:9092", seed), true
	case strings.HasSuffix(at, "SQL.Statement"):
		return fmt.Sprintf("UPDATE t%d SET n = :params1", seed), true
	case strings.HasSuffix(at, "Backoff.Initial"):
		return fmt.Sprintf("%ds", seed), true
	case strings.HasSuffix(at, "Backoff.Max"):
		return fmt.Sprintf("%dm", 10*seed), true
	case strings.HasSuffix(at, "ColumnsKey"):
		return fmt.Sprintf("col_%d", seed), true
	case strings.HasSuffix(at, "SQL.ParamsKey"):
		return "params1", true
	}
	return "", false
}
