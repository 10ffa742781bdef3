package specs

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// What the runtime dials, per source, emit and effect kind.
func TestEgressEndpoints(t *testing.T) {
	env := map[string]string{"DSN": "host=10.0.0.5 port=6432 dbname=app", "MQ": "amqps://u:p@mq.example/vhost", "OUT": "amqp://u:p@10.1.1.1:5673/",
		"MYSQL": "app:s3cret@tcp(10.0.0.7:3307)/app?tls=true", "MYSQL_NOPORT": "app:s3cret@tcp(mariadb.example)/app", "MYSQL_SOCKET": "app@unix(/run/mysqld/mysqld.sock)/app"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		name string
		cfg  config.Config
		want string
	}{
		{"kafka source, redis emit, http effect", config.Config{
			Source: config.Source{Kafka: &config.Kafka{BootstrapServers: []string{"k1:9093", "10.2.0.1"}}},
			Emit:   &config.Emit{RedisStreams: &config.EmitRedisStreams{Address: "redis.example"}},
			Sink:   config.Sink{DSNEnv: "DSN", Effect: config.Effect{HTTP: &config.HTTP{URL: "https://billing.example/charge"}}},
		}, "10.0.0.5:6432 k1:9093 10.2.0.1:9092 redis.example:6379 billing.example:443"},
		{"rabbitmq source with the derived management port, rabbitmq emit", config.Config{
			Source: config.Source{RabbitMQ: &config.RabbitMQ{URIEnv: "MQ"}},
			Emit:   &config.Emit{RabbitMQ: &config.EmitRabbitMQ{URIEnv: "OUT"}},
			Sink:   config.Sink{DSNEnv: "DSN"},
		}, "10.0.0.5:6432 mq.example:5671 mq.example:15671 10.1.1.1:5673"},
		{"nats over websockets, default ports", config.Config{
			Source: config.Source{NATSJetStream: &config.JetStream{URL: "wss://nats.example, ws://10.4.0.1"}},
			Sink:   config.Sink{DSNEnv: "NONE"},
		}, "nats.example:443 10.4.0.1:80"},
		{"mysql sink on its port", config.Config{
			Source: config.Source{RedisStreams: &config.RedisStreams{Address: "10.3.0.1:7000"}},
			Sink:   config.Sink{Kind: config.SinkMySQL, DSNEnv: "MYSQL"},
		}, "10.0.0.7:3307 10.3.0.1:7000"},
		{"mysql sink on the default port", config.Config{
			Source: config.Source{RedisStreams: &config.RedisStreams{Address: "10.3.0.1:7000"}},
			Sink:   config.Sink{Kind: config.SinkMySQL, DSNEnv: "MYSQL_NOPORT"},
		}, "mariadb.example:3306 10.3.0.1:7000"},
		{"mysql sink on a unix socket", config.Config{
			Source: config.Source{RedisStreams: &config.RedisStreams{Address: "10.3.0.1:7000"}},
			Sink:   config.Sink{Kind: config.SinkMySQL, DSNEnv: "MYSQL_SOCKET"},
		}, "10.3.0.1:7000"},
		{"mysql sink whose DSN is unresolved", config.Config{
			Source: config.Source{RedisStreams: &config.RedisStreams{Address: "10.3.0.1:7000"}},
			Sink:   config.Sink{Kind: config.SinkMySQL, DSNEnv: "NONE"},
		}, "10.3.0.1:7000"},
		{"redis source, explicit management URL unused", config.Config{
			Source: config.Source{RedisStreams: &config.RedisStreams{Address: "10.3.0.1:7000"}},
			Sink:   config.Sink{DSNEnv: "NONE"},
		}, "10.3.0.1:7000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, e := range egressEndpoints(&tc.cfg, getenv) {
				got = append(got, fmt.Sprintf("%s:%d", e.host, e.port))
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Fatalf("endpoints %q, want %q", g, tc.want)
			}
		})
	}
}
