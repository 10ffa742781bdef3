package brokerconn

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// Redis are the client settings the caller chooses; the address, password
// and TLS come from the config.
type Redis struct {
	// DialTimeout bounds each dial (0: go-redis's 5 s).
	DialTimeout time.Duration
	// MaxRetries and DialerRetries as in redis.Options (0: go-redis's).
	MaxRetries, DialerRetries int
	// Dial opens the connections (nil: go-redis's dialer).
	Dial Dialer
}

// RedisOptions are the go-redis options for addr with the password held in
// the environment variable passwordEnv (none when empty) and the TLS block
// t (may be nil). getenv nil means os.Getenv.
func RedisOptions(addr, passwordEnv string, t *config.TLS, getenv func(string) string, r Redis) (*redis.Options, error) {
	getenv = lookup(getenv)
	o := &redis.Options{Addr: addr, DialTimeout: r.DialTimeout, MaxRetries: r.MaxRetries, DialerRetries: r.DialerRetries}
	if passwordEnv != "" {
		if o.Password = getenv(passwordEnv); o.Password == "" {
			return nil, fmt.Errorf("environment variable %s (Redis password) is empty", passwordEnv)
		}
	}
	tc, err := TLSConfig(t, getenv)
	if err != nil {
		return nil, err
	}
	o.TLSConfig = tc
	if r.Dial != nil {
		// go-redis runs no TLS handshake over a dialer of the caller's.
		o.Dialer = r.Dial.withTimeout(r.DialTimeout).withTLS(tc)
	}
	return o, nil
}
