package brokerconn

import (
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Kafka are the client settings the caller chooses; seeds, SASL and TLS
// come from the config.
type Kafka struct {
	// ClientID is the client id the brokers log ("": franz-go's "kgo").
	ClientID string
	// DialTimeout bounds each dial (0: franz-go's 10 s).
	DialTimeout time.Duration
	// Dial opens the connections (nil: franz-go's dialer).
	Dial Dialer
}

// KafkaOptions are the franz-go options for the seed brokers, the SASL
// block s and the TLS block t (either may be nil). getenv nil means
// os.Getenv.
func KafkaOptions(seeds []string, s *config.SASL, t *config.TLS, getenv func(string) string, k Kafka) ([]kgo.Opt, error) {
	getenv = lookup(getenv)
	opts := []kgo.Opt{kgo.SeedBrokers(seeds...)}
	if k.ClientID != "" {
		opts = append(opts, kgo.ClientID(k.ClientID))
	}
	if k.DialTimeout > 0 {
		opts = append(opts, kgo.DialTimeout(k.DialTimeout))
	}
	if s != nil {
		m, err := kafkaMechanism(s, getenv)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	tc, err := TLSConfig(t, getenv)
	if err != nil {
		return nil, err
	}
	switch {
	case k.Dial != nil:
		// franz-go takes a dialer or a TLS config, not both: the dialer
		// runs the handshake itself.
		opts = append(opts, kgo.Dialer(k.Dial.withTimeout(k.DialTimeout).withTLS(tc)))
	case tc != nil:
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	return opts, nil
}

// kafkaMechanism reads the SASL credentials from the environment variables
// the block names.
func kafkaMechanism(c *config.SASL, getenv func(string) string) (sasl.Mechanism, error) {
	user, pass := getenv(c.UsernameEnv), getenv(c.PasswordEnv)
	if user == "" || pass == "" {
		return nil, fmt.Errorf("environment variables %s and %s (Kafka SASL credentials) must both be set", c.UsernameEnv, c.PasswordEnv)
	}
	switch strings.ToUpper(c.Mechanism) {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "SCRAM-SHA-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("unsupported Kafka SASL mechanism %q (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)", c.Mechanism)
}
