package controllers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	testclock "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/controllers/sinkdb"
	"github.com/idempotency-dev/idc-operator/internal/natstest"
	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// The controller suite runs the real manager against a real kube-apiserver
// and etcd (envtest), the real PostgreSQL and a real NATS JetStream on
// loopback (TestMain: the built nats-server 2.15.3 the suite starts itself,
// or with IDC_TEST_NATS=system the machine's 2.9.10). Assertions read
// through a direct client, not the manager's cache. There is no
// kube-controller-manager in envtest, so tests play the Deployment
// controller by writing Deployment status themselves.

const adminDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// natsURL is the NATS JetStream server of the run (TestMain).
var natsURL string

// TestMain starts the suite's NATS server: the current nats-server unless
// IDC_TEST_NATS picks the machine's (internal/natstest). The Ginkgo specs
// (TestControllers) and the plain tests share it.
func TestMain(m *testing.M) {
	os.Exit(natstest.MainOne(m, "controllers", &natsURL))
}

var (
	env       *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
	ctx       context.Context
	cancel    context.CancelFunc
	clk       *testclock.FakeClock
	testDB    string
	testDSN   string
	js        jetstream.JetStream
	nc        *nats.Conn
	// sinkClient is the suite reconciler's sink database client.
	sinkClient *sinkdb.Client
	// ensures records when the suite reconciler provisioned each inbox.
	ensures = &ensureTimes{at: map[string][]time.Time{}}
)

// ensureTimes records, per owner (namespace/name), when the reconciler
// called Ensure: a pass that reached the inbox phase.
type ensureTimes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (e *ensureTimes) of(owner string) []time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.at[owner])
}

// recordingSink is the real sink client with Ensure recorded.
type recordingSink struct{ *sinkdb.Client }

func (r recordingSink) Ensure(ctx context.Context, t sinkdb.Target) (sinkdb.Ensured, error) {
	ensures.mu.Lock()
	ensures.at[t.Owner] = append(ensures.at[t.Owner], time.Now())
	ensures.mu.Unlock()
	return r.Client.Ensure(ctx, t)
}

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "IdempotentConsumer controller (envtest + PostgreSQL + NATS)")
}

func randomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createDatabase creates a fresh database for the suite and returns its DSN.
func createDatabase(name string) string {
	conn, err := pgx.Connect(ctx, adminDSN)
	Expect(err).NotTo(HaveOccurred(), "PostgreSQL must run on 127.0.0.1:5432 (make services)")
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	Expect(err).NotTo(HaveOccurred())
	return fmt.Sprintf("postgres://postgres@127.0.0.1:5432/%s?sslmode=disable", name)
}

// recheckPeriod is the suite's re-check period of a sink, inbox or broker
// that is not ready (the default, 20s, is covered by
// TestEffectRecheckWithin30s).
const recheckPeriod = 2 * time.Second

// createOrdersTable creates schema.orders as newConsumer maps it, granted to
// role when set.
func createOrdersTable(schema, role string) {
	conn, err := pgx.Connect(ctx, testDSN)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close(ctx)
	s := pgx.Identifier{schema}.Sanitize()
	stmts := []string{"CREATE SCHEMA IF NOT EXISTS " + s,
		"CREATE TABLE IF NOT EXISTS " + s + ".orders (order_id text PRIMARY KEY, status text, version bigint)"}
	if role != "" {
		stmts = append(stmts, "GRANT SELECT, INSERT, UPDATE ON "+s+".orders TO "+pgx.Identifier{role}.Sanitize())
	}
	for _, stmt := range stmts {
		_, err := conn.Exec(ctx, stmt)
		Expect(err).NotTo(HaveOccurred(), stmt)
	}
}

func dropDatabase(name string) {
	conn, err := pgx.Connect(context.Background(), adminDSN)
	Expect(err).NotTo(HaveOccurred())
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	Expect(err).NotTo(HaveOccurred())
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	ctx, cancel = context.WithCancel(context.Background())

	testDB = "idc_ctrl_test_" + randomSuffix()
	testDSN = createDatabase(testDB)
	// The effect table of newConsumer: the EffectReady preflight holds the
	// runtime at 0 replicas without it.
	createOrdersTable("projections", "")

	var err error
	nc, err = nats.Connect(natsURL)
	Expect(err).NotTo(HaveOccurred(), "NATS JetStream at %s is required (make nats; with IDC_TEST_NATS=system, make services)", natsURL)
	js, err = jetstream.New(nc)
	Expect(err).NotTo(HaveOccurred())

	env, err = testenv.New()
	Expect(err).NotTo(HaveOccurred())
	cfg, err = env.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(messagingv1alpha1.AddToScheme(scheme)).To(Succeed())
	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	RegisterMetrics(ctrlmetrics.Registry)
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Cache: CacheOptions(nil)})
	Expect(err).NotTo(HaveOccurred())
	clk = testclock.NewFakeClock(time.Now())
	sinkClient = sinkdb.New()
	r := NewReconciler(mgr, Options{RuntimeImage: "idc-operator:test", RetentionPeriod: 5 * time.Minute, Clock: clk, Sink: recordingSink{sinkClient},
		RecheckPeriod: recheckPeriod, NetworkPolicies: true})
	Expect(r.SetupWithManager(mgr)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	cancel()
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
	if nc != nil {
		nc.Close()
	}
	if testDB != "" {
		dropDatabase(testDB)
	}
})
