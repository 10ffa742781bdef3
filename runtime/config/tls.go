package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientConfig builds a client TLS configuration from the PEM data held in
// the environment variables this block names. A nil block means no TLS.
func (c *TLS) ClientConfig() (*tls.Config, error) {
	if c == nil {
		return nil, nil
	}
	out := &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The user opts into this explicitly in the IdempotentConsumer.
		InsecureSkipVerify: c.InsecureSkipVerify, //nolint:gosec
	}
	if c.CAEnv != "" {
		pem := os.Getenv(c.CAEnv)
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
		cert, err := tls.X509KeyPair([]byte(os.Getenv(c.CertEnv)), []byte(os.Getenv(c.KeyEnv)))
		if err != nil {
			return nil, fmt.Errorf("while loading the TLS client certificate from %s and %s: %w", c.CertEnv, c.KeyEnv, err)
		}
		out.Certificates = []tls.Certificate{cert}
	}
	return out, nil
}
