// Package brokerconn builds the client settings of the four brokers the
// runtime talks to (NATS JetStream, Kafka, RabbitMQ, Redis) from the
// runtime/config blocks: TLS, credentials and dial options. The source
// adapters, the outbox publishers and the retention inspectors all use it,
// so a credential is read, and kept out of error messages, in one place.
//
// Every builder takes a getenv that resolves the environment variable names
// the config holds (nil: os.Getenv; the controller passes a lookup over the
// referenced Secrets' values) and an optional Dialer, through which every
// connection of the client is opened (nil: a net.Dialer, as each client
// library does by default). No error message carries a credential: only the
// names of the variables that hold them.
package brokerconn

import (
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"os"
	"time"
)

// lookup returns getenv, or os.Getenv for nil.
func lookup(getenv func(string) string) func(string) string {
	if getenv == nil {
		return os.Getenv
	}
	return getenv
}

// RedactURL drops the password from a URL for messages; a value that does
// not parse is not echoed at all.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// Dialer opens one network connection. A client built with a Dialer opens
// every connection through it, so a caller (a test) can count or refuse
// them; nil leaves the client library's own dialer.
type Dialer func(ctx context.Context, network, addr string) (net.Conn, error)

// withTimeout bounds each dial by timeout (none when timeout <= 0).
func (d Dialer) withTimeout(timeout time.Duration) Dialer {
	if timeout <= 0 {
		return d
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return d(ctx, network, addr)
	}
}

// withTLS dials through d and runs the TLS handshake with tc (its
// ServerName defaulting to the dialled host); tc nil leaves the connection
// plain. It is for clients that skip their own TLS when given a dialer.
func (d Dialer) withTLS(tc *tls.Config) Dialer {
	if tc == nil {
		return d
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		c := tc.Clone()
		if c.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				c.ServerName = host
			}
		}
		conn := tls.Client(raw, c)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return conn, nil
	}
}
