package controllers

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// The status fixtures in config/argocd/testdata are what the Argo CD health
// check and the kstatus test (test/gitops) are run against. They are written
// by this file from the controller's own status functions, so they carry the
// condition types, reasons and generations the controller really writes:
//
//	IDC_UPDATE_FIXTURES=1 go test ./controllers -run TestStatusFixtures
//
// A fixture may also be replaced by a dump from a real cluster
// (`kubectl get idc NAME -o yaml`, from the e2e run): the check below compares
// only what the health checks read (generation, observedGeneration, condition
// types, statuses, reasons), not messages or timestamps.

const fixtureDir = "../config/argocd/testdata"

// fixtureScenario is one state of a resource, as a reconcile pass leaves it.
type fixtureScenario struct {
	name string
	// obs is what the pass observed; nil means the controller never wrote
	// status (a resource just created).
	obs *observation
	// passFailed: the pass returned an error (retried with backoff), so
	// status.observedGeneration is not stamped.
	passFailed bool
	// specEdited: the spec changed after the pass (generation+1), and the
	// controller has not observed it yet.
	specEdited bool
	suspend    bool
	// autoscale sets spec.runtime.autoscaling (the Autoscaling condition).
	autoscale bool
}

func fixtureScenarios() []fixtureScenario {
	ok := okOutcome
	secrets := ok(messagingv1alpha1.ReasonReady, "all referenced Secrets found")
	inbox := ok(messagingv1alpha1.ReasonProvisioned, "inbox projections.inbox_orders_projector (layout Table, schema version 2) and its dead-letter and prune-run tables exist")
	retention := ok(messagingv1alpha1.ReasonBrokerValues, "window 49h from the broker: stream ORDERS max_age=48h; consumer ack_wait=30s max_deliver=5")
	effect := ok(messagingv1alpha1.ReasonReady, "table projections.orders has every mapped column, a unique key on (order_id) and the privileges the upsert needs")
	runtime := ok(messagingv1alpha1.ReasonReady, "2/2 replicas available")
	prune := ok(messagingv1alpha1.ReasonScheduled, "the prune CronJob runs on \"*/30 * * * *\" with window 49h")
	limits := ok(messagingv1alpha1.ReasonLimitsFit, "broker-side limits hold replicas (2) x batchSize (500) x inFlight (2)")
	ready := func(mod func(o *observation)) *observation {
		o := &observation{secrets: secrets, inbox: inbox, effect: effect, retention: retention, runtime: runtime, prune: prune, brokerLimits: limits}
		if mod != nil {
			mod(o)
		}
		return o
	}
	// A sink only a person can fix stalls the resource (needsHuman).
	effectFailed := func(reason, msg string) *observation {
		return ready(func(o *observation) {
			o.effect = failed(reason, msg)
			o.stalled = failed(reason, msg)
			o.runtime = failed(messagingv1alpha1.ReasonWaitingForEffect, "the Deployment is held at 0 replicas until EffectReady is True ("+reason+")")
		})
	}
	inboxFailed := func(reason, msg string) *observation {
		o := &observation{secrets: secrets, inbox: failed(reason, msg)}
		if needsHuman(reason) {
			o.stalled = failed(reason, msg)
		}
		return o
	}
	return []fixtureScenario{
		{name: "ready", obs: ready(nil)},
		{name: "ready-explicit-window", obs: ready(func(o *observation) {
			o.retention = ok(messagingv1alpha1.ReasonExplicit, "window 168h (spec.retention.window)")
		})},
		{name: "ready-prune-suspended", obs: ready(func(o *observation) {
			o.prune = failed(messagingv1alpha1.ReasonPruneSuspended, "the prune CronJob is suspended: spec.retention.prune.suspend is true")
		})},
		{name: "ready-broker-limit-too-small", obs: ready(func(o *observation) {
			o.brokerLimits = failed(messagingv1alpha1.ReasonBrokerLimitTooSmall, "JetStream consumer orders-projector on stream ORDERS has MaxAckPending=100, below replicas (2) x batchSize (500) x inFlight (2) = 2000, so replicas wait for acknowledgements instead of fetching; raise it (nats consumer edit ORDERS orders-projector --max-pending 8000) or delete the consumer so the runtime creates one sized for the declared scale")
		})},
		{name: "ready-autoscaled-by-keda", autoscale: true, obs: ready(func(o *observation) {
			o.autoscaling = ok(messagingv1alpha1.ReasonScaledByKEDA, "KEDA scales the Deployment between 1 and 8 replicas at 1000 backlog per replica")
		})},
		{name: "ready-keda-not-installed", autoscale: true, obs: ready(func(o *observation) {
			o.autoscaling = failed(messagingv1alpha1.ReasonKEDANotInstalled, "spec.runtime.autoscaling is set but KEDA is not installed (no keda.sh/v1alpha1 ScaledObject in the API): the Deployment runs a fixed 1 replica(s) (minReplicas, at least 1) until KEDA is installed")
		})},
		{name: "ready-scaledobject-not-ready", autoscale: true, obs: ready(func(o *observation) {
			o.autoscaling = failed(messagingv1alpha1.ReasonScaledObjectNotReady, "KEDA: Triggers defined in ScaledObject are not working correctly")
		})},
		{name: "suspended", suspend: true, obs: ready(func(o *observation) {
			o.runtime = ok(messagingv1alpha1.ReasonSuspended, "spec.suspend is true: the runtime is scaled to 0 replicas")
		})},
		{name: "suspended-prune-held-back", suspend: true, obs: ready(func(o *observation) {
			o.runtime = ok(messagingv1alpha1.ReasonSuspended, "spec.suspend is true: the runtime is scaled to 0 replicas")
			o.prune = ok(messagingv1alpha1.ReasonPruneHeldBack, "the last prune run (2026-12-01T12:00:00Z) kept ids its window would have deleted: replica orders-projector-7d9f-x2k4-1a2b3c4d stopped without acknowledging everything it committed (last progress 2026-12-01T11:20:00Z, 40m ago); the broker may still redeliver them (JetStream consumer orders-projector on stream ORDERS: ack floor 0, delivered 200, ack pending 200)")
		})},
		{name: "new-generation-not-observed", specEdited: true, obs: ready(nil)},
		{name: "progressing-just-created"},
		{name: "progressing-deployment-not-available", obs: ready(func(o *observation) {
			o.runtime = failed(messagingv1alpha1.ReasonDeploymentNotReady, "0/2 replicas available")
		})},
		{name: "stalled-effect-table-not-found", obs: effectFailed(messagingv1alpha1.ReasonTableNotFound,
			"table \"projections\".\"orders\" (spec.sink.effect.upsert.table) does not exist in the sink database; create it, e.g. CREATE TABLE \"projections\".\"orders\" (\"order_id\" <type>, \"status\" <type>, \"version\" bigint, PRIMARY KEY (\"order_id\")), or run the service's migration")},
		{name: "stalled-effect-permission-denied", obs: effectFailed(messagingv1alpha1.ReasonPermissionDenied,
			"role \"orders_writer\" lacks INSERT, UPDATE on \"projections\".\"orders\" (spec.sink.effect.upsert); run GRANT INSERT, UPDATE ON \"projections\".\"orders\" TO \"orders_writer\"")},
		{name: "stalled-effect-column-not-found", obs: effectFailed(messagingv1alpha1.ReasonColumnNotFound,
			"column \"status\" of table \"projections\".\"orders\" (spec.sink.effect.upsert.columns.status) does not exist; run ALTER TABLE \"projections\".\"orders\" ADD COLUMN \"status\" <type>, or remove it from the mapping")},
		{name: "stalled-effect-column-type-mismatch", obs: effectFailed(messagingv1alpha1.ReasonColumnTypeMismatch,
			"the sequence column \"version\" of table \"projections\".\"orders\" (spec.sink.effect.upsert.sequenceColumn) is text, but the sequence gate needs an integer type; run ALTER TABLE \"projections\".\"orders\" ALTER COLUMN \"version\" TYPE bigint USING \"version\"::bigint")},
		{name: "stalled-effect-no-unique-key", obs: effectFailed(messagingv1alpha1.ReasonNoUniqueKey,
			"no primary key or unique index of \"projections\".\"orders\" covers exactly the upsert key (\"order_id\") (spec.sink.effect.upsert.key), which ON CONFLICT needs; run CREATE UNIQUE INDEX ON \"projections\".\"orders\" (\"order_id\")")},
		{name: "stalled-effect-statement-invalid", obs: effectFailed(messagingv1alpha1.ReasonStatementInvalid,
			"spec.sink.effect.sql.statement does not prepare: syntax error at or near \"WHER\" (SQLSTATE 42601); fix the statement")},
		{name: "progressing-broker-unreachable", obs: ready(func(o *observation) {
			o.retention = failed(messagingv1alpha1.ReasonBrokerUnreachable, "cannot read retention settings from the broker: dial tcp 10.0.0.9:4222: connection refused; keeping the last window 49h")
		})},
		{name: "progressing-waiting-for-retention", obs: ready(func(o *observation) {
			o.retention = failed(messagingv1alpha1.ReasonBrokerUnreachable, "cannot read retention settings from the broker: dial tcp 10.0.0.9:4222: connection refused; no window was resolved yet, so pruning is suspended")
			o.prune = failed(messagingv1alpha1.ReasonWaitingForWindow, "the prune CronJob is suspended: no retention window is known yet")
		})},
		{name: "progressing-secret-not-found", passFailed: true, obs: &observation{
			secrets: failed(messagingv1alpha1.ReasonSecretNotFound, "Secret \"orders-db\" (spec.sink.postgres.connectionSecretRef) does not exist"),
		}},
		{name: "progressing-secret-key-missing", passFailed: true, obs: &observation{
			secrets: failed(messagingv1alpha1.ReasonSecretKeyMissing, "Secret \"orders-db\" has no key \"dsn\" (spec.sink.postgres.connectionSecretRef)"),
		}},
		{name: "stalled-invalid-dsn", obs: inboxFailed(messagingv1alpha1.ReasonInvalidDSN,
			"the connection string in Secret \"orders-db\" key \"dsn\" cannot be parsed; expected postgres://user:password@host:5432/db or key=value form")},
		{name: "progressing-database-unreachable", obs: inboxFailed(messagingv1alpha1.ReasonDatabaseError,
			"cannot reach the database of Secret \"orders-db\" key \"dsn\": connection refused; retrying with backoff")},
		{name: "stalled-permission-denied", obs: inboxFailed(messagingv1alpha1.ReasonPermissionDenied,
			"permission denied on the database named by Secret \"orders-db\" key \"dsn\" (SQLSTATE 42501: permission denied for schema projections); grant the role CREATE on the database and schema (GRANT USAGE, CREATE ON SCHEMA \"projections\" TO the role)")},
		{name: "stalled-authentication-failed", obs: inboxFailed(messagingv1alpha1.ReasonAuthenticationFailed,
			"the sink database refused the credentials in Secret \"orders-db\" key \"dsn\" (SQLSTATE 28P01: password authentication failed for user \"orders\"): check the user and password in the connection string (and pg_hba.conf)")},
		{name: "progressing-migration-queued", obs: inboxFailed(messagingv1alpha1.ReasonMigrationQueued,
			"the inbox migration in the database named by Secret \"orders-db\" key \"dsn\" is queued: the inbox migration gave up waiting for a migration slot: waited 20s for one of the 2 migrations allowed at once on the sink database, all held by other inboxes' migrations; it runs on the next check")},
		{name: "progressing-provisioning-failed", obs: inboxFailed(messagingv1alpha1.ReasonProvisioningFailed,
			"provisioning the inbox in schema projections failed (SQLSTATE 53100: could not extend file)")},
		// A deletion that left the tables in place writes this one condition
		// just before the finalizer goes (reconcileDelete).
		{name: "deleting-inbox-retained", obs: inboxFailed(messagingv1alpha1.ReasonInboxRetained,
			"the inbox tables of projections.inbox_orders_projector were left in place (deletionPolicy: Delete): the spec no longer renders: message.id: exactly one of header, jsonPath, brokerNative must be set (got 0); drop them by hand if they are no longer needed")},
		{name: "stalled-invalid-spec", obs: &observation{
			stalled: failed(messagingv1alpha1.ReasonInvalidSpec, "spec.sink.effect.upsert.key: column \"order_id\" is not among the columns"),
		}},
		{name: "stalled-image-not-allowed", obs: &observation{
			stalled: failed(messagingv1alpha1.ReasonImageNotAllowed, "spec.runtime.image \"registry.example/other:1.0\" is not an image this operator runs (allowed: idc-operator:0.2.0); remove spec.runtime.image, or have the operator's administrator add it to --allowed-runtime-images (Helm value allowedRuntimeImages). Nothing was deployed with it"),
		}},
		{name: "stalled-conflict", obs: &observation{
			stalled: failed(messagingv1alpha1.ReasonConflict, "inbox table projections.inbox_orders_projector is already used by IdempotentConsumer default/orders-projector-old"),
		}},
		{name: "stalled-stream-not-partitioned", obs: func() *observation {
			msg := "the stream cannot be consumed in partitions: JetStream stream ORDERS has no subject transform (partitions: 4 needs a subject transform whose destination holds {{partition(4,...)}}); add one, e.g. nats stream edit ORDERS --transform-source 'orders.*' --transform-destination 'orders.{{partition(4,1)}}.{{wildcard(1)}}'; keeping the last window 49h"
			o := ready(nil)
			o.retention = failed(messagingv1alpha1.ReasonStreamNotPartitioned, msg)
			o.stalled = failed(messagingv1alpha1.ReasonStreamNotPartitioned, msg)
			return o
		}()},
		{name: "stalled-unbounded-replay", obs: func() *observation {
			msg := "the broker can replay without bound (stream ORDERS max_age=0 (unlimited)); set spec.retention.maxReplayAge to bound it. Pruning is suspended and nothing is deleted meanwhile"
			o := ready(nil)
			o.retention = failed(messagingv1alpha1.ReasonUnboundedReplay, msg)
			o.stalled = failed(messagingv1alpha1.ReasonUnboundedReplay, msg)
			o.prune = failed(messagingv1alpha1.ReasonWaitingForWindow, "the prune CronJob is suspended: the retention window is not resolved")
			return o
		}()},
	}
}

var fixtureTime = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))

// renderFixture builds the resource as the API server would return it after
// the scenario's pass.
func renderFixture(t *testing.T, s fixtureScenario) *messagingv1alpha1.IdempotentConsumer {
	t.Helper()
	raw, err := os.ReadFile("../config/samples/messaging_v1alpha1_idempotentconsumer_jetstream_upsert.yaml")
	if err != nil {
		t.Fatal(err)
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := yaml.Unmarshal(raw, idc); err != nil {
		t.Fatal(err)
	}
	idc.Namespace, idc.Generation, idc.CreationTimestamp = "default", 2, fixtureTime
	idc.Spec.Suspend = s.suspend
	if s.autoscale {
		idc.Spec.Runtime.Replicas = nil
		idc.Spec.Runtime.Autoscaling = &messagingv1alpha1.AutoscalingSpec{MaxReplicas: 8, PollingInterval: "30s",
			CooldownPeriod: "5m", ScaleDownStabilization: "5m", NATSAccount: "$G"}
	}
	if s.obs == nil {
		idc.Generation = 1
		return idc
	}
	idc.Status.Source = sourceSummary(idc)
	idc.Status.Guarantee = guaranteeFor(idc)
	setConditions(idc, s.obs)
	if !s.passFailed {
		idc.Status.ObservedGeneration = idc.Generation
	}
	for i := range idc.Status.Conditions {
		idc.Status.Conditions[i].LastTransitionTime = fixtureTime
	}
	if s.specEdited {
		idc.Generation++
	}
	return idc
}

func TestStatusFixtures(t *testing.T) {
	update := os.Getenv("IDC_UPDATE_FIXTURES") == "1"
	seenReasons := map[string]bool{}
	for _, s := range fixtureScenarios() {
		want := renderFixture(t, s)
		path := filepath.Join(fixtureDir, s.name+".yaml")
		if update {
			writeFixture(t, path, want)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (regenerate: IDC_UPDATE_FIXTURES=1 go test ./controllers -run TestStatusFixtures)", err)
		}
		got := &messagingv1alpha1.IdempotentConsumer{}
		if err := yaml.Unmarshal(raw, got); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if g, w := healthShape(got), healthShape(want); g != w {
			t.Errorf("%s does not match what the controller writes for %q:\n got: %s\nwant: %s\n(regenerate: IDC_UPDATE_FIXTURES=1 go test ./controllers -run TestStatusFixtures)", path, s.name, g, w)
		}
		for _, c := range got.Status.Conditions {
			seenReasons[c.Reason] = true
		}
	}
	// Every reason the API declares must be met by the health checks in at
	// least one fixture: a new reason needs a scenario here.
	for _, reason := range declaredReasons(t) {
		if !seenReasons[reason] {
			t.Errorf("no fixture in %s has a condition with reason %q: add a scenario to fixtureScenarios", fixtureDir, reason)
		}
	}
}

// healthShape is what the Argo CD health check and kstatus read, with
// generations relative to metadata.generation so a dump from a real cluster
// (any generation) compares equal to the scenario it shows.
func healthShape(idc *messagingv1alpha1.IdempotentConsumer) string {
	relative := func(observed int64) string {
		switch {
		case observed == 0:
			return "unset"
		case observed < idc.Generation:
			return "behind"
		default:
			return "current"
		}
	}
	conds := make([]string, 0, len(idc.Status.Conditions))
	for _, c := range idc.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s/%s@%s", c.Type, c.Status, c.Reason, relative(c.ObservedGeneration)))
	}
	sort.Strings(conds)
	return fmt.Sprintf("observedGeneration=%s suspend=%t %s", relative(idc.Status.ObservedGeneration), idc.Spec.Suspend, strings.Join(conds, " "))
}

// declaredReasons reads the Reason constants from the API package's source
// that the controller's code (not its tests) uses.
func declaredReasons(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile("../api/v1alpha1/status_types.go")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		code.Write(b)
	}
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^\s*(Reason\w+)\s*=\s*"(\w+)"`).FindAllStringSubmatch(string(src), -1) {
		if regexp.MustCompile(`\bmessagingv1alpha1\.` + m[1] + `\b`).MatchString(code.String()) {
			out = append(out, m[2])
		}
	}
	if len(out) < 10 {
		t.Fatalf("found only %d Reason constants used by the controller", len(out))
	}
	return out
}

func writeFixture(t *testing.T, path string, idc *messagingv1alpha1.IdempotentConsumer) {
	t.Helper()
	idc.APIVersion, idc.Kind = messagingv1alpha1.GroupVersion.String(), "IdempotentConsumer"
	out, err := yaml.Marshal(idc)
	if err != nil {
		t.Fatal(err)
	}
	header := "# Written by `IDC_UPDATE_FIXTURES=1 go test ./controllers -run TestStatusFixtures`\n" +
		"# from the controller's status functions, or dumped from a real cluster\n" +
		"# (kubectl get idc -o yaml). Read by test/gitops (Argo CD Lua health check, kstatus).\n"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append([]byte(header), out...), 0o644); err != nil {
		t.Fatal(err)
	}
}
