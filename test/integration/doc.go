// Package integration holds cross-package tests of the data plane against
// real services on loopback: PostgreSQL, MariaDB, NATS JetStream, RabbitMQ
// and Redis (and Kafka through franz-go's in-process kfake cluster, the only
// Kafka on this machine). A service that is down fails the tests; they
// never skip. The crash tests with the real binary (the COMMIT/ack
// failpoint, the pipeline's chaos, the outage longer than the window) run
// on each sink database through sinkDB (sinkdb_test.go) and print one
// CRASH or PIPELINE line per database.
package integration
