// Package chaos is the chaos suite (DESIGN.md section 8): kill -9 at random
// points under load, then prove from the database that nothing was lost and
// nothing was applied twice.
//
// The workload is published to a private JetStream stream in bursts: 20% of
// the messages are re-sent copies of earlier events (half right after their
// original, half later), and the versions of each entity key are shuffled.
// No message carries a Nats-Msg-Id header, so JetStream's duplicate window
// never swallows a copy; the dedup id is the payload's $.eventId (the run
// checks that the stream stored every publication). The last tenth is held
// back after the timed bursts and released a chunk at a time while a
// failpoint kill is owed, once a replica armed with it is up: the runtime
// drains a burst faster than a killed replica restarts, so without work
// held for it an armed replica would never reach a commit.
//
// Two durable consumers read the stream, three replicas each, every replica
// the real idc-runtime binary (`run --config FILE`):
//
//   - append: one chaos.events row per applied message and no unique
//     constraint, so a double application is a second row;
//   - upsert: one chaos.orders row per key behind the sequence gate
//     (sequenceColumn version); a trigger logs every row change.
//
// A driver injects faults at random moments while a consumer has a backlog
// (so replicas are mid-batch): SIGKILL of a random replica, restarted after
// a random pause, some restarts armed with
// IDC_FAILPOINT=after-commit-before-ack so the process kills itself exactly
// between COMMIT and ack; and a cut of every runtime session of the run's
// database: pg_terminate_backend of its backends (application_name
// idc-runtime) on PostgreSQL, KILL CONNECTION of its sessions (the
// processlist's DB is the run's database, which the test's own connections
// never select) on MariaDB. When everything is
// published and drained and the minimums are met, faults stop; the run waits
// until both consumers have nothing undelivered or unacknowledged and no
// replica's idc_messages_total moves, then stops the replicas with SIGTERM
// and requires a graceful exit.
//
// The checker loads the publisher's record (the events JetStream
// acknowledged) into chaos.published and, from the database alone, prints
//
//	CHAOS kills=<n> published=<n> unique=<n> applied=<n> doubled=<n> lost=<n> stale=<n> db=<postgres|mariadb>
//
// kills: SIGKILLs (the driver's plus failpoint ones); published: messages
// JetStream acknowledged, copies included; unique: distinct event ids;
// applied: ids with an append row; doubled: ids with more than one; lost: ids
// that an inbox neither holds nor dead-lettered, or that have no append row
// and were not dead-lettered; stale: keys whose orders row is missing, below
// the highest published version or not that event's state, plus row changes
// that did not move a key forward. The test fails on doubled, lost or stale,
// on rows for ids never published, on any dead letter (every message is
// well-formed), on an exit nobody caused, and on too little chaos.
//
// TestChaos runs once per sink database, as subtests postgres and mariadb:
// the same run through sinkDB, each dialect with its own DDL, cut and
// checker SQL (on MariaDB, sink.kind mysql, the tables of schema chaos are
// in the run's own database, which is the config's sink.schema);
// TestCheckerCatchesViolations proves that each checker counts what it
// claims. The short form (10,000 messages, >= 5 kills of which >= 1 at the
// failpoint, >= 5 cuts; about 25 s per database) runs in `go test ./...`;
// IDC_CHAOS=long runs the long form (100,000 messages, >= 30 kills of which
// >= 5 at the failpoint, >= 5 cuts; `make test-chaos`). PostgreSQL
// (127.0.0.1:5432, or IDC_TEST_PG_DSN) and MariaDB (127.0.0.1:3306 as root,
// or IDC_TEST_MYSQL_DSN) must be up; NATS JetStream is the nats-server
// 2.15.3 the suite starts itself (internal/natstest; IDC_TEST_NATS=system:
// the machine's 2.9.10 on 127.0.0.1:4222, which `make test` runs too, and
// then it must be up): the suite fails, never skips, when any is down.
// IDC_CHAOS_RUNTIME_BIN runs a prebuilt idc-runtime instead of building
// one, e.g. a deliberately broken build to see the checker catch it.
package chaos
