package brokerconn

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

const secret = "s3cret-value"

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// wantErr fails unless err is set, names want and never shows the secret.
func wantErr(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one naming %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %q", err, want)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks a credential: %q", err)
	}
}

// serverCA starts a TLS server and returns it with its certificate as PEM.
func serverCA(t *testing.T) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewTLSServer(nil)
	t.Cleanup(srv.Close)
	der := srv.Certificate().Raw
	return srv, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func TestTLSConfig(t *testing.T) {
	if tc, err := TLSConfig(nil, nil); tc != nil || err != nil {
		t.Fatalf("nil block: %v, %v; want no TLS", tc, err)
	}
	_, caPEM := serverCA(t)
	getenv := env(map[string]string{"CA": caPEM, "JUNK": secret, "EMPTY": ""})

	_, err := TLSConfig(&config.TLS{CAEnv: "EMPTY"}, getenv)
	wantErr(t, err, "environment variable EMPTY (TLS CA) is empty")
	_, err = TLSConfig(&config.TLS{CAEnv: "JUNK"}, getenv)
	wantErr(t, err, "environment variable JUNK (TLS CA) holds no PEM certificate")
	_, err = TLSConfig(&config.TLS{CertEnv: "JUNK", KeyEnv: "JUNK"}, getenv)
	wantErr(t, err, "while loading the TLS client certificate from JUNK and JUNK")

	tc, err := TLSConfig(&config.TLS{CAEnv: "CA", InsecureSkipVerify: true}, getenv)
	if err != nil {
		t.Fatal(err)
	}
	if tc.RootCAs == nil || !tc.InsecureSkipVerify {
		t.Errorf("RootCAs %v, InsecureSkipVerify %v; want the CA pool and the opt-in", tc.RootCAs, tc.InsecureSkipVerify)
	}
	// nil getenv reads the process environment.
	t.Setenv("IDC_BROKERCONN_TEST_CA", caPEM)
	if tc, err := TLSConfig(&config.TLS{CAEnv: "IDC_BROKERCONN_TEST_CA"}, nil); err != nil || tc.RootCAs == nil {
		t.Fatalf("from os.Getenv: %v, %v", tc, err)
	}
}

func TestNATSOptionsCredentials(t *testing.T) {
	_, err := NATSOptions("CREDS", nil, env(nil), NATS{})
	wantErr(t, err, "environment variable CREDS (NATS credentials) is empty")
	_, err = NATSOptions("", &config.TLS{CAEnv: "CA"}, env(map[string]string{"CA": secret}), NATS{})
	wantErr(t, err, "CA (TLS CA) holds no PEM certificate")
	opts, err := NATSOptions("", nil, env(nil), NATS{Name: "x", Reconnect: true})
	if err != nil || len(opts) == 0 {
		t.Fatalf("%d options, %v", len(opts), err)
	}
}

func TestKafkaOptionsSASL(t *testing.T) {
	sasl := &config.SASL{Mechanism: "PLAIN", UsernameEnv: "USER", PasswordEnv: "PASS"}
	_, err := KafkaOptions([]string{"127.0.0.1:9092"}, sasl, nil, env(map[string]string{"USER": "idc"}), Kafka{})
	wantErr(t, err, "environment variables USER and PASS (Kafka SASL credentials) must both be set")
	creds := env(map[string]string{"USER": "idc", "PASS": secret})
	_, err = KafkaOptions(nil, &config.SASL{Mechanism: "GSSAPI", UsernameEnv: "USER", PasswordEnv: "PASS"}, nil, creds, Kafka{})
	wantErr(t, err, `unsupported Kafka SASL mechanism "GSSAPI"`)
	for _, m := range []string{"PLAIN", "scram-sha-256", "SCRAM-SHA-512"} {
		sasl.Mechanism = m
		if _, err := KafkaOptions(nil, sasl, nil, creds, Kafka{}); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
}

func TestAMQPURI(t *testing.T) {
	_, _, err := AMQPURI("URI", env(nil))
	wantErr(t, err, "environment variable URI (AMQP URI) is empty")
	_, _, err = AMQPURI("URI", env(map[string]string{"URI": "http://idc:" + secret + "@host/"}))
	wantErr(t, err, "environment variable URI does not hold a valid amqp:// or amqps:// URI")
	raw, uri, err := AMQPURI("URI", env(map[string]string{"URI": "amqps://idc:" + secret + "@mq.example:5671/orders"}))
	if err != nil || uri.Host != "mq.example" || uri.Vhost != "orders" || uri.Password != secret || !strings.HasPrefix(raw, "amqps://") {
		t.Fatalf("parsed %+v, %v", uri, err)
	}
}

func TestNewManagementBase(t *testing.T) {
	_, plain, _ := AMQPURI("U", env(map[string]string{"U": "amqp://guest:guest@127.0.0.1:5672/"}))
	_, secure, _ := AMQPURI("U", env(map[string]string{"U": "amqps://guest:guest@mq.example:5671/"}))
	for _, tc := range []struct {
		spec         string
		uri          string
		base, origin string
	}{
		{"", "plain", "http://127.0.0.1:15672", "derived from the AMQP host; managementURL unset"},
		{"", "secure", "https://mq.example:15671", "derived from the AMQP host; managementURL unset"},
		{"https://mgmt.example:8443/", "plain", "https://mgmt.example:8443", "spec: managementURL"},
	} {
		u := plain
		if tc.uri == "secure" {
			u = secure
		}
		m, err := NewManagement(tc.spec, u, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.Base != tc.base || m.Origin != tc.origin {
			t.Errorf("managementURL %q, %s URI: base %q (%s), want %q (%s)", tc.spec, tc.uri, m.Base, m.Origin, tc.base, tc.origin)
		}
		m.Close()
	}
}

func TestRedisOptions(t *testing.T) {
	_, err := RedisOptions("127.0.0.1:6379", "PASS", nil, env(nil), Redis{})
	wantErr(t, err, "environment variable PASS (Redis password) is empty")
	o, err := RedisOptions("127.0.0.1:6379", "PASS", nil, env(map[string]string{"PASS": secret}), Redis{MaxRetries: 1})
	if err != nil || o.Password != secret || o.MaxRetries != 1 || o.Dialer != nil {
		t.Fatalf("options %+v, %v", o, err)
	}
}

// A Dialer given to a client that skips its own TLS with one (franz-go,
// go-redis) still gets TLS: the handshake verifies the server against the
// configured CA, and fails without it.
func TestDialerWithTLS(t *testing.T) {
	srv, caPEM := serverCA(t)
	addr := srv.Listener.Addr().String()
	var dials atomic.Int32
	d := Dialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	})
	tc, err := TLSConfig(&config.TLS{CAEnv: "CA"}, env(map[string]string{"CA": caPEM}))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.withTimeout(5*time.Second).withTLS(tc)(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatalf("TLS through the dialer: %v", err)
	}
	_ = conn.Close()
	other := x509.NewCertPool() // trusts nothing
	tc.RootCAs = other
	if conn, err := d.withTLS(tc)(t.Context(), "tcp", addr); err == nil {
		_ = conn.Close()
		t.Fatal("the handshake accepted a server the CA does not vouch for")
	}
	if n := dials.Load(); n != 2 {
		t.Errorf("%d dials through the Dialer, want 2", n)
	}
}
