package retention

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const (
	amqpURI  = "amqp://guest:guest@127.0.0.1:5672/"
	mgmtURL  = "http://127.0.0.1:15672"
	amqpEnv  = "IDC_TEST_AMQP_URI"
	rabbitVH = "/"
)

var rabbitEnv = envMap(map[string]string{amqpEnv: amqpURI})

func amqpChannel(t *testing.T) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(amqpURI)
	if err != nil {
		t.Fatalf("RabbitMQ is not reachable at 127.0.0.1:5672 (start it with `make services`): %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func declareQueue(t *testing.T, ch *amqp.Channel, args amqp.Table) string {
	t.Helper()
	name := unique("idc-ret")
	if _, err := ch.QueueDeclare(name, true, false, false, false, args); err != nil {
		t.Fatalf("declaring queue %s %v: %v", name, args, err)
	}
	t.Cleanup(func() {
		ch2 := amqpChannel(t)
		_, _ = ch2.QueueDelete(name, false, false, false)
	})
	return name
}

func mgmt(t *testing.T, method, path string, body any) {
	t.Helper()
	var buf bytes.Buffer
	if body != nil {
		if err := json.NewEncoder(&buf).Encode(body); err != nil {
			t.Fatal(err)
		}
	}
	req, err := http.NewRequestWithContext(testCtx(t), method, mgmtURL+path, &buf)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("guest", "guest")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("RabbitMQ management API at %s: %v", mgmtURL, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: HTTP %d", method, path, resp.StatusCode)
	}
}

// setPolicy applies a policy to exactly one queue and removes it at cleanup.
func setPolicy(t *testing.T, queue string, definition map[string]any) string {
	t.Helper()
	name := unique("idc-ret-policy")
	path := "/api/policies/" + url.PathEscape(rabbitVH) + "/" + url.PathEscape(name)
	mgmt(t, http.MethodPut, path, map[string]any{
		"pattern": "^" + regexp.QuoteMeta(queue) + "$", "definition": definition, "apply-to": "queues", "priority": 100,
	})
	t.Cleanup(func() { mgmt(t, http.MethodDelete, path, nil) })
	return name
}

func rabbitCfg(queue string, r config.Retention) *config.Config {
	return baseConfig(config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpEnv, Queue: queue, ManagementURL: mgmtURL}}, r)
}

// eventually derives until the window is want: the management API shows a
// new policy only after its next statistics refresh (every 5s by default).
func eventually(t *testing.T, cfg *config.Config, want time.Duration) Result {
	t.Helper()
	var (
		res Result
		err error
	)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if res, err = Derive(testCtx(t), cfg, rabbitEnv, time.Now()); err == nil && res.Window == want {
			return res
		}
	}
	t.Fatalf("window %s (error %v), want %s (derivedFrom: %s)", res.Window, err, want, res.DerivedFrom)
	return res
}

func TestRabbitMQLiveClassicTTL(t *testing.T) {
	t.Parallel()
	ch := amqpChannel(t)
	q := declareQueue(t, ch, amqp.Table{"x-message-ttl": int32(3600000)})
	cfg := rabbitCfg(q, retention(24*time.Hour, time.Hour, 0))

	// L = 1h (argument), classic: A = ∞, replay 0 → W = 1h + 1h.
	res := mustDerive(t, cfg, rabbitEnv)
	wantWindow(t, res, 2*time.Hour, "queue "+q+" vhost / type=classic (broker)", "message-ttl=1h (queue argument x-message-ttl)",
		"no delivery limit (classic queue)", "consumer_timeout=30m (broker default")

	// A policy with a lower message-ttl wins (RabbitMQ applies the lower).
	pol := setPolicy(t, q, map[string]any{"message-ttl": 1800000})
	res = eventually(t, cfg, 90*time.Minute)
	wantWindow(t, res, 90*time.Minute, "message-ttl=30m (policy "+pol+" message-ttl)")
}

func TestRabbitMQLiveClassicPolicyOnly(t *testing.T) {
	t.Parallel()
	ch := amqpChannel(t)
	q := declareQueue(t, ch, nil)
	cfg := rabbitCfg(q, retention(24*time.Hour, time.Hour, 0))
	// No TTL and unbounded attempts: the redelivery horizon is unbounded.
	_, err := Derive(testCtx(t), cfg, rabbitEnv, time.Now())
	if !errors.Is(err, ErrUnboundedReplay) || !strings.Contains(err.Error(), "redelivery is unbounded") {
		t.Fatalf("classic queue without TTL: want ErrUnboundedReplay (redelivery), got %v", err)
	}
	// A TTL set by policy bounds it: Derive follows.
	setPolicy(t, q, map[string]any{"message-ttl": 7200000})
	eventually(t, cfg, 3*time.Hour)
}

func TestRabbitMQLiveQuorumDeliveryLimit(t *testing.T) {
	t.Parallel()
	ch := amqpChannel(t)
	q := declareQueue(t, ch, amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(4)})
	cfg := rabbitCfg(q, retention(24*time.Hour, time.Hour, 0))
	// No TTL; A = 5 deliveries × 30m (default consumer_timeout) = 2h30m.
	wantWindow(t, mustDerive(t, cfg, rabbitEnv), 27*time.Hour+30*time.Minute,
		"type=quorum", "delivery-limit=4 (queue argument x-delivery-limit): at most 5 deliveries")
	// A declared consumer_timeout of 10m: A = 50m.
	cfg.Retention.ConsumerTimeout.Duration = 10 * time.Minute
	wantWindow(t, mustDerive(t, cfg, rabbitEnv), 25*time.Hour+50*time.Minute, "consumer_timeout=10m (spec: retention.consumerTimeout)")
	// A policy with a lower delivery-limit wins.
	setPolicy(t, q, map[string]any{"delivery-limit": 1})
	eventually(t, cfg, 25*time.Hour+20*time.Minute)
}

func TestRabbitMQLiveStream(t *testing.T) {
	ch := amqpChannel(t)
	q := declareQueue(t, ch, amqp.Table{"x-queue-type": "stream", "x-max-age": "2D"})
	// Management URL derived from the AMQP host.
	cfg := baseConfig(config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpEnv, Queue: q}}, retention(24*time.Hour, time.Hour, 0))
	res := mustDerive(t, cfg, rabbitEnv)
	wantWindow(t, res, 49*time.Hour, "type=stream", "max-age=48h (queue argument x-max-age, raw 2D)",
		"management API at http://127.0.0.1:15672 (derived from the AMQP host")
	if res.ReplayHorizon.String() != "48h" {
		t.Errorf("replay %s", res.ReplayHorizon)
	}
	// A stream without max-age keeps everything.
	q2 := declareQueue(t, ch, amqp.Table{"x-queue-type": "stream"})
	if _, err := Derive(testCtx(t), rabbitCfg(q2, retention(time.Hour, time.Hour, 0)), rabbitEnv, time.Now()); !errors.Is(err, ErrUnboundedReplay) {
		t.Fatalf("stream without max-age: want ErrUnboundedReplay, got %v", err)
	}
}

func TestRabbitMQLiveErrors(t *testing.T) {
	amqpChannel(t)
	_, err := Derive(testCtx(t), rabbitCfg(unique("idc-ret-missing"), retention(time.Hour, time.Hour, 0)), rabbitEnv, time.Now())
	if !errors.Is(err, ErrSourceNotFound) {
		t.Fatalf("missing queue: want ErrSourceNotFound, got %v", err)
	}

	badPass := envMap(map[string]string{amqpEnv: "amqp://guest:s3cret-pw@127.0.0.1:5672/"})
	_, err = Derive(testCtx(t), rabbitCfg("any", retention(time.Hour, time.Hour, 0)), badPass, time.Now())
	if err == nil || errors.Is(err, ErrBrokerUnreachable) || !strings.Contains(err.Error(), "refused the credentials") || strings.Contains(err.Error(), "s3cret-pw") {
		t.Fatalf("wrong password: want a credentials error without the password, got %v", err)
	}

	badURI := envMap(map[string]string{amqpEnv: "amqp://guest:s3cret pw@127.0.0.1:5672/"})
	_, err = Derive(testCtx(t), rabbitCfg("any", retention(time.Hour, time.Hour, 0)), badURI, time.Now())
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("invalid URI: want an error without the password, got %v", err)
	}

	cfg := baseConfig(config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: amqpEnv, Queue: "q", ManagementURL: "http://127.0.0.1:1"}}, retention(time.Hour, time.Hour, 0))
	wantUnreachable(t, cfg, envMap(map[string]string{amqpEnv: "amqp://guest:s3cret-pw@127.0.0.1:5672/"}), "s3cret-pw")
}
