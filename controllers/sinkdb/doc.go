// Package sinkdb is the controller's side of the sink database, PostgreSQL
// or MySQL/MariaDB (Target.Sink.DatabaseKind()): it provisions and drops a
// resource's inbox tables (through the dialect seam, runtime/sink: the DDL
// the runtime shares), names the physical database that holds them
// (sink.DB.PhysicalDatabase), runs the read-only EffectReady preflight (a
// checker per kind, dialect.go), reads
// what the runtime and its jobs recorded there (prune runs, redrives, the
// outbox backlog, id conflicts), keeps the window state, and holds the
// connection pools those calls use.
//
// Pools are shared by the resources that name the same connection string
// and closed as soon as the last of them lets go (deleted, or its Secret
// rotated to another string), so a rotated password does not stay in
// memory and no health-check goroutine outlives its users.
package sinkdb
