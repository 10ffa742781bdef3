package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

func jsSource(partitions int) *config.Config {
	return &config.Config{Source: config.Source{NATSJetStream: &config.JetStream{URL: "nats://x", Stream: "ORDERS", Consumer: "idc", Partitions: partitions}}}
}

func TestSelectPartition(t *testing.T) {
	for _, tc := range []struct {
		partitions, i int
		set           bool
		wantErr       string
	}{
		{0, -1, false, ""},
		{0, 0, true, "--partition is set, but the source is not partitioned"},
		{4, -1, false, "--partition must be one of 0..3: the source is read in 4 partitions (source.natsJetStream.partitions), each replica reads one; got not set"},
		{4, 4, true, "--partition must be one of 0..3"},
		{4, -1, true, "got -1"},
		{4, 0, true, ""},
		{4, 3, true, ""},
	} {
		cfg := jsSource(tc.partitions)
		err := selectPartition(cfg, tc.i, tc.set)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || exitCode(err) != exitUsage {
				t.Errorf("partitions %d, --partition %d (set %v): %v (exit %d), want a usage error saying %q", tc.partitions, tc.i, tc.set, err, exitCode(err), tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("partitions %d, --partition %d: %v", tc.partitions, tc.i, err)
			continue
		}
		j := cfg.Source.NATSJetStream
		if tc.partitions == 0 {
			if j.Consumer != "idc" || j.OnePartition || applicationName(cfg) != "idc-runtime" {
				t.Errorf("unpartitioned config changed: %+v (application_name %q)", j, applicationName(cfg))
			}
			continue
		}
		// Its sessions say which partition they serve in pg_stat_activity.
		if got, want := applicationName(cfg), fmt.Sprintf("idc-runtime p%d", tc.i); got != want {
			t.Errorf("partition %d: application_name %q, want %q", tc.i, got, want)
		}
		// The replica reads, and records in its progress row, its
		// partition's durable.
		if id := retention.IdentityOf(cfg.Source, nil); id.Name != "ORDERS/idc-p"+string(rune('0'+tc.i)) || !j.OnePartition || j.PartitionIndex != tc.i {
			t.Errorf("partition %d: identity %s, config %+v", tc.i, id.Name, j)
		}
	}
	// Other sources take no --partition.
	rabbit := &config.Config{Source: config.Source{RabbitMQ: &config.RabbitMQ{Queue: "q"}}}
	if err := selectPartition(rabbit, 1, true); err == nil {
		t.Error("--partition accepted for RabbitMQ")
	}
}

// The prune job reads each silent replica's own consumer: of a partitioned
// source, the partition durable its progress row names.
func TestSettleTarget(t *testing.T) {
	id := func(name string) *inbox.ConsumerIdentity {
		return &inbox.ConsumerIdentity{Kind: "NATSJetStream", Name: name}
	}
	rec := func(c *inbox.ConsumerIdentity) inbox.ProgressRecord {
		return inbox.ProgressRecord{Replica: "r", HeartbeatAt: time.Now(), Consumer: c}
	}
	plain := jsSource(0)
	if key, target := settleTarget(plain, rec(id("ORDERS/idc-p2"))); key != "" || target != plain {
		t.Errorf("unpartitioned: %q %+v, want cfg's own", key, target)
	}
	cfg := jsSource(4)
	for _, tc := range []struct {
		rec     inbox.ProgressRecord
		durable string
	}{
		{rec(id("ORDERS/idc-p2")), "idc-p2"},
		{rec(id("ORDERS/idc-p0")), "idc-p0"},
		{rec(nil), "idc"},                // an older runtime's record
		{rec(id("OTHER/idc-p1")), "idc"}, // another stream
		{rec(&inbox.ConsumerIdentity{Kind: "Kafka", Name: "ORDERS/idc-p1"}), "idc"}, // another kind
	} {
		key, target := settleTarget(cfg, tc.rec)
		j := target.Source.NATSJetStream
		if key != "ORDERS/"+tc.durable || j.Consumer != tc.durable || j.Partitioned() || j.OnePartition {
			t.Errorf("record %+v: key %q, target %+v; want %s read alone", tc.rec.Consumer, key, j, tc.durable)
		}
		if got := retention.IdentityOf(target.Source, nil).Name; got != key {
			t.Errorf("the reading names %s, the key %s", got, key)
		}
	}
	if cfg.Source.NATSJetStream.Consumer != "idc" || cfg.Source.NATSJetStream.Partitions != 4 {
		t.Errorf("settleTarget changed the config: %+v", cfg.Source.NATSJetStream)
	}
}
