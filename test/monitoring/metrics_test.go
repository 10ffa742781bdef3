package monitoring

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/idempotency-dev/idc-operator/controllers"
	"github.com/idempotency-dev/idc-operator/internal/mysqltest"
	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/internal/testbin"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TestNamedMetricsAreExported runs the real idc-runtime against JetStream
// and each sink database (PostgreSQL, MariaDB), scrapes its /metrics and
// fails for every idc_ metric an alert or the dashboard names that the
// runtime does not export, and for every idc_ sample that does not carry
// the sink's kind: the same rules and dashboard serve both databases.
func TestNamedMetricsAreExported(t *testing.T) {
	for _, kind := range []config.SinkKind{config.SinkPostgres, config.SinkMySQL} {
		t.Run(string(kind), func(t *testing.T) { testNamedMetricsAreExported(t, kind) })
	}
}

func testNamedMetricsAreExported(t *testing.T, kind config.SinkKind) {
	names := namedMetrics(t)
	if len(names) < 10 {
		t.Fatalf("found only %d metric names in the rules and the dashboard: the extraction is broken", len(names))
	}
	body := scrapeRuntime(t, kind)
	if unlabelled := withoutSinkKind(body, kind); len(unlabelled) > 0 {
		t.Fatalf("idc_ samples without sink_kind=%q:\n  %s", kind, strings.Join(unlabelled, "\n  "))
	}
	exported := parseExposition(body)
	t.Run("CheckReportsAnUnknownName", func(t *testing.T) {
		// The comparison must be able to fail: a rule naming a metric the
		// runtime does not export is reported.
		bogus := map[string]string{"idc_not_exported_total": "alert Bogus", "idc_messages_total": "alert Real"}
		got := missingMetrics(bogus, exported)
		if len(got) != 1 || !strings.HasPrefix(got[0], "idc_not_exported_total ") {
			t.Fatalf("missingMetrics = %v, want only idc_not_exported_total", got)
		}
	})
	// The dashboard also charts the manager's per-resource series
	// (idc_resource_*): those are checked against what the manager
	// describes, the rest against the runtime's /metrics.
	described := managerDescribed()
	fromManager := map[string]string{}
	for n, where := range names {
		if strings.HasPrefix(n, "idc_resource_") {
			fromManager[n] = where
			delete(names, n)
		}
	}
	if missing := missingMetrics(fromManager, described); len(missing) > 0 {
		t.Fatalf("named in config/prometheus as the manager's but not described by it:\n  %s", strings.Join(missing, "\n  "))
	}
	if missing := missingMetrics(names, exported); len(missing) > 0 {
		t.Fatalf("named in config/prometheus but not exported by idc-runtime:\n  %s", strings.Join(missing, "\n  "))
	}
	t.Logf("%d metric names checked against the runtime's /metrics, %d against the manager's", len(names), len(fromManager))
}

// TestManagerNamedMetricsAreRegistered fails for every idc_ metric an alert
// of the manager group names that the manager does not register on
// controller-runtime's registry (which its /metrics serves).
func TestManagerNamedMetricsAreRegistered(t *testing.T) {
	names := managerNamedMetrics(t)
	if len(names) == 0 {
		t.Fatal("found no metric names in the manager's rule group: the extraction is broken")
	}
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	for _, f := range families {
		registered[f.GetName()] = true
	}
	// Vectors without a series yet are not gathered: describe them instead.
	for n := range managerDescribed() {
		registered[n] = true
	}
	if missing := missingMetrics(names, registered); len(missing) > 0 {
		t.Fatalf("named in the manager's rule group but not registered by the manager:\n  %s", strings.Join(missing, "\n  "))
	}
}

var descName = regexp.MustCompile(`fqName: "([a-z0-9_]+)"`)

// managerDescribed is every metric name the manager's collector describes
// (its per-resource idc_resource_* series among them).
func managerDescribed() map[string]bool {
	out := map[string]bool{}
	descs := make(chan *prometheus.Desc, 64)
	go func() { controllers.DescribeMetrics(descs); close(descs) }()
	for d := range descs {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			out[m[1]] = true
		}
	}
	return out
}

// parseExposition returns every series name of a text exposition: the
// families' names, plus _bucket/_sum/_count for histograms and summaries.
// withoutSinkKind returns the idc_ sample lines of an exposition that lack
// the label sink_kind="<kind>".
func withoutSinkKind(text string, kind config.SinkKind) []string {
	var out []string
	want := `sink_kind="` + string(kind) + `"`
	samples := 0
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "idc_") {
			continue
		}
		samples++
		if !strings.Contains(line, want) {
			out = append(out, line)
		}
	}
	if samples == 0 {
		out = append(out, "(no idc_ sample at all)")
	}
	return out
}

func parseExposition(text string) map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					out[f[2]+s] = true
				}
			}
		}
	}
	return out
}

func scrapeRuntime(t *testing.T, kind config.SinkKind) string {
	t.Helper()
	bin := testbin.Build(t, testbin.RuntimePackage, "idc-runtime")
	schema, dsn := "app", ""
	if kind == config.SinkMySQL {
		schema, dsn = mysqltest.NewDatabase(t)
		createMySQLSink(t, dsn)
	} else {
		_, dsn = pgtest.Create(t, "idc_monitoring_test")
		createSink(t, dsn)
	}
	env := "IDC_MONITORING_DSN"
	t.Setenv(env, dsn)
	stream := newStream(t)
	addr := freeAddr(t)
	cfg := &config.Config{
		Name:    "monitoring/orders",
		Source:  config.Source{NATSJetStream: &config.JetStream{URL: natsURL, Stream: stream, Consumer: "projector"}},
		Message: config.Message{ID: config.Extractor{JSONPath: "$.id"}},
		Sink: config.Sink{Kind: kind, DSNEnv: env, Schema: schema, InboxTable: "inbox_orders", Layout: config.LayoutTable,
			Effect: config.Effect{Append: &config.Append{Table: "effects", Columns: map[string]string{"message_id": "@messageId"}}}},
		Delivery:   config.Delivery{BatchSize: 10, MaxWait: config.Duration{Duration: 100 * time.Millisecond}},
		Retention:  config.Retention{Mode: "Explicit", Window: config.Duration{Duration: time.Hour}},
		HealthAddr: addr,
	}
	cfg.Default()
	path := filepath.Join(t.TempDir(), "config.json")
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	cmd := exec.Command(bin, "run", "--config", path, "--consumer-name", "monitoring-0")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("idc-runtime logs:\n%s", logs.String())
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		code, _, err := get(base + "/readyz")
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("idc-runtime not ready within 60s (last: %d, %v)", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	code, body, err := get(base + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics = %d, %v", code, err)
	}
	return body
}

func createSink(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA app; CREATE TABLE app.effects (message_id text NOT NULL)"); err != nil {
		t.Fatalf("creating the sink table: %v", err)
	}
}

func createMySQLSink(t *testing.T, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	if _, err := db.ExecContext(ctx, "CREATE TABLE effects (message_id VARCHAR(255) NOT NULL)"); err != nil {
		t.Fatalf("creating the sink table: %v", err)
	}
}

func get(url string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newStream creates a JetStream stream with a durable pull consumer
// "projector", deleted at the end.
func newStream(t *testing.T) string {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatalf("NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services): %v", natsURL, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("IDC_MON_%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	if _, err := js.CreateConsumer(ctx, name, jetstream.ConsumerConfig{Durable: "projector", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatalf("creating consumer: %v", err)
	}
	return name
}
