package config

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestPartitionsValidation(t *testing.T) {
	for _, tc := range []struct {
		partitions int
		filter     string
		field      string
	}{
		{0, "", ""}, {0, "orders.*", ""}, {2, "", ""}, {64, "", ""},
		{1, "", "source.natsJetStream.partitions"},
		{-1, "", "source.natsJetStream.partitions"},
		{65, "", "source.natsJetStream.partitions"},
		{4, "orders.*", "source.natsJetStream.filterSubject"},
	} {
		c := emitConfig(nil)
		c.Source.NATSJetStream.Partitions, c.Source.NATSJetStream.FilterSubject = tc.partitions, tc.filter
		err := c.Validate()
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("partitions %d filter %q: %v", tc.partitions, tc.filter, err)
		case tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field+": ")):
			t.Errorf("partitions %d filter %q: %v does not name %s", tc.partitions, tc.filter, err, tc.field)
		}
	}
}

func TestForPartition(t *testing.T) {
	j := JetStream{URL: "u", Stream: "ORDERS", Consumer: "orders-idc", Partitions: 4}
	p := j.ForPartition(2)
	if p.Consumer != "orders-idc-p2" || p.PartitionIndex != 2 || !p.OnePartition || p.Partitions != 4 || p.Stream != "ORDERS" {
		t.Errorf("ForPartition(2) = %+v", p)
	}
	if j.Consumer != "orders-idc" || j.OnePartition {
		t.Errorf("ForPartition changed its receiver: %+v", j)
	}
	if q := p.ForPartition(3); q.Consumer != "orders-idc-p3" || q.PartitionIndex != 3 {
		t.Errorf("ForPartition(3) of partition 2's view = %+v", q)
	}
	want := []string{"orders-idc-p0", "orders-idc-p1", "orders-idc-p2", "orders-idc-p3"}
	for _, got := range [][]string{j.PartitionConsumers(), p.PartitionConsumers()} {
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("PartitionConsumers = %v, want %v", got, want)
		}
	}
	if (JetStream{Consumer: "c"}).PartitionConsumers() != nil {
		t.Error("an unpartitioned config has partition consumers")
	}
	// The view is never written to the shared ConfigMap.
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, "artitionIndex") || strings.Contains(s, "nePartition") || !strings.Contains(s, `"partitions":4`) {
		t.Errorf("marshalled view: %s", s)
	}
}
