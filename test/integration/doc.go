// Package integration holds cross-package tests of the data plane against
// real services on loopback: PostgreSQL, NATS JetStream, RabbitMQ and Redis
// (and Kafka through franz-go's in-process kfake cluster, the only Kafka on
// this machine). A service that is down fails the tests; they never skip.
package integration
