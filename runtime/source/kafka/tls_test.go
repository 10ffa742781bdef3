package kafka

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/source/sourcetest"
)

// selfSigned returns a server certificate for 127.0.0.1 and its PEM.
func selfSigned(t *testing.T) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "kfake"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         true,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestTLS runs kfake behind TLS; the CA reaches the adapter through the
// environment variable the config names.
func TestTLS(t *testing.T) {
	cert, caPEM := selfSigned(t)
	f := newFixture(t, 1, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	t.Setenv("IDC_TEST_KAFKA_CA", caPEM)
	tc, err := brokerconn.TLSConfig(&config.TLS{CAEnv: "IDC_TEST_KAFKA_CA"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.clientOpts = []kgo.Opt{kgo.DialTLSConfig(tc)}
	f.publish(t, []sourcetest.Outgoing{{ID: "a", Body: []byte("1")}})
	cfg := f.cfg()
	cfg.TLS = &config.TLS{CAEnv: "IDC_TEST_KAFKA_CA"}
	s := newSource(t, cfg)
	defer s.Close()
	if err := s.Ack(t.Context(), fetchN(t, s, 1)); err != nil {
		t.Fatal(err)
	}
	// Without the CA the server certificate is not trusted.
	cfg.TLS = &config.TLS{}
	if bad, err := New(t.Context(), cfg, logr.Discard()); err == nil {
		_ = bad.Close()
		t.Fatal("New trusted an unknown CA")
	}
	t.Setenv("IDC_TEST_KAFKA_CA", "not pem")
	if _, err := brokerconn.TLSConfig(&config.TLS{CAEnv: "IDC_TEST_KAFKA_CA"}, nil); err == nil {
		t.Fatal("tlsConfig accepted a CA variable without PEM")
	}
}
