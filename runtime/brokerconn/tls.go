package brokerconn

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// TLSConfig builds a client TLS configuration from the PEM data held in the
// environment variables the block names; a nil block means no TLS (nil).
// getenv nil means os.Getenv.
func TLSConfig(c *config.TLS, getenv func(string) string) (*tls.Config, error) {
	if c == nil {
		return nil, nil
	}
	getenv = lookup(getenv)
	out := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The user opts into this explicitly in the IdempotentConsumer.
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec // explicit opt-in
	}
	if c.CAEnv != "" {
		pem := getenv(c.CAEnv)
		if pem == "" {
			return nil, fmt.Errorf("environment variable %s (TLS CA) is empty", c.CAEnv)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(pem)) {
			return nil, fmt.Errorf("environment variable %s (TLS CA) holds no PEM certificate", c.CAEnv)
		}
		out.RootCAs = pool
	}
	if c.CertEnv != "" || c.KeyEnv != "" {
		cert, err := tls.X509KeyPair([]byte(getenv(c.CertEnv)), []byte(getenv(c.KeyEnv)))
		if err != nil {
			return nil, fmt.Errorf("while loading the TLS client certificate from %s and %s: %w", c.CertEnv, c.KeyEnv, err)
		}
		out.Certificates = []tls.Certificate{cert}
	}
	return out, nil
}
