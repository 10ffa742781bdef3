package brokerconn

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// amqpDialTimeout bounds the TCP connect and the AMQP handshake, as
// amqp.DefaultDial(30 s) does.
const amqpDialTimeout = 30 * time.Second

// AMQPURI reads the amqp:// or amqps:// URI (credentials included) from the
// environment variable uriEnv and parses it. The errors name the variable
// and never quote its value. getenv nil means os.Getenv.
func AMQPURI(uriEnv string, getenv func(string) string) (string, amqp.URI, error) {
	raw := lookup(getenv)(uriEnv)
	if raw == "" {
		return "", amqp.URI{}, fmt.Errorf("environment variable %s (AMQP URI) is empty", uriEnv)
	}
	uri, err := amqp.ParseURI(raw)
	if err != nil {
		// The parser's message can quote the URI, password included.
		return "", amqp.URI{}, fmt.Errorf("environment variable %s does not hold a valid amqp:// or amqps:// URI", uriEnv)
	}
	return raw, uri, nil
}

// AMQP are the connection settings the caller chooses; the URI and TLS come
// from the config.
type AMQP struct {
	// ConnectionName is the name the broker shows ("": none).
	ConnectionName string
	// Heartbeat is the heartbeat interval asked for (0: the server's).
	Heartbeat time.Duration
	// Dial opens the connection (nil: amqp.DefaultDial(30 s)).
	Dial Dialer
}

// AMQPConfig is the amqp091 dial configuration for the TLS block t (may be
// nil). getenv nil means os.Getenv.
func AMQPConfig(t *config.TLS, getenv func(string) string, a AMQP) (amqp.Config, error) {
	tc, err := TLSConfig(t, getenv)
	if err != nil {
		return amqp.Config{}, err
	}
	out := amqp.Config{Heartbeat: a.Heartbeat, TLSClientConfig: tc, Dial: amqp.DefaultDial(amqpDialTimeout)}
	if a.ConnectionName != "" {
		out.Properties = amqp.NewConnectionProperties()
		out.Properties.SetClientConnectionName(a.ConnectionName)
	}
	if a.Dial != nil {
		dial := a.Dial.withTimeout(amqpDialTimeout)
		out.Dial = func(network, addr string) (net.Conn, error) {
			conn, err := dial(context.Background(), network, addr)
			if err != nil {
				return nil, err
			}
			// As amqp.DefaultDial: the handshake must finish in time (the
			// heartbeater moves the deadline on afterwards).
			if err := conn.SetDeadline(time.Now().Add(amqpDialTimeout)); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return conn, nil
		}
	}
	return out, nil
}

// Management is a client of the RabbitMQ management API, authenticated with
// the credentials of the AMQP URI.
type Management struct {
	// Base is the API's base URL, without a trailing slash and without
	// credentials.
	Base string
	// Origin says where Base came from, for messages.
	Origin string
	user   string
	pass   string
	client *http.Client
}

// NewManagement returns the management API client: managementURL, or the
// AMQP host on the management plugin's default port (15672, https 15671 for
// amqps). t is the TLS block of the source (may be nil); dial opens the
// connections (nil: the HTTP transport's dialer). getenv nil means
// os.Getenv.
func NewManagement(managementURL string, uri amqp.URI, t *config.TLS, getenv func(string) string, dial Dialer) (*Management, error) {
	base, origin := managementURL, "spec: managementURL"
	if base == "" {
		scheme, port := "http", 15672
		if uri.Scheme == "amqps" {
			scheme, port = "https", 15671
		}
		base = scheme + "://" + net.JoinHostPort(uri.Host, strconv.Itoa(port))
		origin = "derived from the AMQP host; managementURL unset"
	}
	tc, err := TLSConfig(t, getenv)
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	if dial != nil {
		tr.DialContext = dial
	}
	return &Management{
		Base:   strings.TrimRight(base, "/"),
		Origin: origin,
		user:   uri.Username,
		pass:   uri.Password,
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second, CheckRedirect: refuseRedirect},
	}, nil
}

// NewRequest builds GET Base+path with the URI's credentials (in a header:
// the URL in an error carries none).
func (m *Management) NewRequest(ctx context.Context, path string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.Base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("while building the management API request: %w", err)
	}
	req.SetBasicAuth(m.user, m.pass)
	return req, nil
}

// Do sends a request built by NewRequest. The caller closes the body.
func (m *Management) Do(req *http.Request) (*http.Response, error) { return m.client.Do(req) }

// Close closes the idle connections kept for further calls.
func (m *Management) Close() { m.client.CloseIdleConnections() }

// refuseRedirect follows no redirect: the request carries the AMQP
// credentials as Basic auth, and a management URL must not be a way to
// send them (or the operator's requests) to a host the resource did not
// name. The caller gets the 3xx response and reports it.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
