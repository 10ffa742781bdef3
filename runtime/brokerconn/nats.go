package brokerconn

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// NATS are the connection settings the caller chooses; the credentials and
// TLS come from the config.
type NATS struct {
	// Name is the connection name the server shows.
	Name string
	// Reconnect keeps reconnecting forever, pausing ReconnectWait (0:
	// nats.go's 2 s) between attempts; false makes one connection that is
	// never re-established (a short-lived reading).
	Reconnect     bool
	ReconnectWait time.Duration
	// Timeout bounds the connect (0: nats.go's 2 s).
	Timeout time.Duration
	// Dial opens the connections (nil: nats.go's dialer).
	Dial Dialer
}

// NATSOptions are the nats.go options for a connection with the .creds file
// held in the environment variable credentialsEnv (none when empty) and the
// TLS block t (may be nil). getenv nil means os.Getenv.
func NATSOptions(credentialsEnv string, t *config.TLS, getenv func(string) string, s NATS) ([]nats.Option, error) {
	getenv = lookup(getenv)
	var opts []nats.Option
	if s.Name != "" {
		opts = append(opts, nats.Name(s.Name))
	}
	if s.Reconnect {
		opts = append(opts, nats.MaxReconnects(-1))
		if s.ReconnectWait > 0 {
			opts = append(opts, nats.ReconnectWait(s.ReconnectWait))
		}
	} else {
		opts = append(opts, nats.NoReconnect())
	}
	if s.Timeout > 0 {
		opts = append(opts, nats.Timeout(s.Timeout))
	}
	if s.Dial != nil {
		opts = append(opts, nats.SetCustomDialer(natsDialer{dial: s.Dial, timeout: s.Timeout}))
	}
	if credentialsEnv != "" {
		creds := getenv(credentialsEnv)
		if creds == "" {
			return nil, fmt.Errorf("environment variable %s (NATS credentials) is empty", credentialsEnv)
		}
		opts = append(opts, nats.UserCredentialBytes([]byte(creds)))
	}
	tc, err := TLSConfig(t, getenv)
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// ConnectJetStream connects to url with opts (NATSOptions and the
// caller's) and opens the JetStream context; the connection is closed when
// that fails. The errors show the URL without its password.
func ConnectJetStream(url string, opts []nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("while connecting to NATS at %s: %w", RedactURL(url), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("while opening the JetStream context: %w", err)
	}
	return nc, js, nil
}

// natsDialer adapts a Dialer to nats.CustomDialer (nats.go runs the TLS
// handshake itself on the connection it returns).
type natsDialer struct {
	dial    Dialer
	timeout time.Duration
}

func (d natsDialer) Dial(network, address string) (net.Conn, error) {
	timeout := d.timeout
	if timeout <= 0 {
		timeout = nats.DefaultTimeout
	}
	return d.dial.withTimeout(timeout)(context.Background(), network, address)
}
