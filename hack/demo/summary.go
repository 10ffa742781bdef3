package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// summary prints the counts, the table and the conditions; ok says whether
// every unique id took effect exactly once and the resource is Ready.
func (d *demo) summary(ctx context.Context) (bool, error) {
	pods, err := d.cluster.ConsumerPods(ctx, d.idc)
	if err != nil {
		return false, err
	}
	m, err := localcluster.Metrics(ctx, pods)
	if err != nil {
		return false, err
	}
	out, err := d.workload.Verify(ctx, d.dsn, d.idc)
	if err != nil {
		return false, err
	}
	restarts := 0
	for _, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			restarts += int(cs.RestartCount)
		}
	}
	d.printCounts(m, out, len(pods), restarts)

	t, err := localcluster.Table(ctx, d.cluster.Config, localcluster.IdempotentConsumers, namespace)
	if err != nil {
		return false, err
	}
	_, _ = fmt.Fprintf(d.out, "\n$ kubectl -n %s get idc -o wide\n%s", namespace, localcluster.RenderTable(t, true))
	if err := d.printPods(ctx); err != nil {
		return false, err
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := d.cluster.Client.Get(ctx, d.key(), idc); err != nil {
		return false, err
	}
	_, _ = fmt.Fprintf(d.out, "\nStatus conditions of %s/%s (generation %d, observed %d):\n%s",
		namespace, idc.Name, idc.Generation, idc.Status.ObservedGeneration, indent(localcluster.RenderConditions(idc)))
	ready := localcluster.IsReady(idc)
	verdict := "OK: every unique id took effect exactly once; Ready=True"
	if !out.OK() || !ready {
		verdict = fmt.Sprintf("FAILED: effects %d for %d unique ids, projection mismatches %v, Ready=%s",
			out.InboxRows, out.UniqueIDs, out.Mismatches, localcluster.Condition(idc, messagingv1alpha1.ConditionReady))
	}
	_, _ = fmt.Fprintf(d.out, "\n%s\n", verdict)
	return out.OK() && ready, nil
}

func (d *demo) printCounts(m map[string]float64, out localcluster.Outcome, replicas, restarts int) {
	s, w := d.published, d.workload
	_, _ = fmt.Fprintf(d.out, "\nSummary\n")
	tw := tabwriter.NewWriter(d.out, 0, 8, 2, ' ', 0)
	row := func(name string, value any, note string) { _, _ = fmt.Fprintf(tw, "  %s\t%v\t%s\n", name, value, note) }
	row("published", s.Published, fmt.Sprintf("%d stored by JetStream; %d immediate producer retries dropped by its own %s Nats-Msg-Id window",
		s.Stored, s.DroppedByBroker, localcluster.StreamDuplicateWindow))
	row("  unique ids", len(w.UniqueIDs), fmt.Sprintf("%d orders x %d versions; %d orders with two versions swapped", len(w.Latest), d.opts.versions, w.Swapped))
	row("  re-sent later", s.Resent, "past the broker's window, like redeliveries and replays: only the inbox can catch them")
	row("  poison", s.Poison, "one without Nats-Msg-Id, one whose body is not JSON")
	metricNote := fmt.Sprintf("idc_messages_total over %d replicas", replicas)
	if restarts > 0 {
		metricNote += fmt.Sprintf(" (%d restarts: a restarted replica's counters start again at 0)", restarts)
	}
	row("delivered", m["idc_messages_total"], metricNote)
	row("duplicates skipped", m["idc_duplicates_skipped_total"], "idc_duplicates_skipped_total: ids already in the inbox")
	row("stale refused", m["idc_stale_refused_total"], "idc_stale_refused_total: the sequence gate, and older versions superseded in their batch")
	row("dead letters", m["idc_dead_letters_total"], fmt.Sprintf("idc_dead_letters_total; %d rows in the dead-letter table", out.DeadLetterRows))
	row("effects", out.InboxRows, fmt.Sprintf("unique ids recorded in the inbox, each once, in the effect's transaction: %s %d unique ids",
		cmp(out.InboxRows == out.UniqueIDs), out.UniqueIDs))
	row("projection", fmt.Sprintf("%d/%d", out.OrdersAtLatest, out.Orders), "orders whose row holds their latest version")
	_ = tw.Flush()
}

func cmp(equal bool) string {
	if equal {
		return "="
	}
	return "!="
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ") + "\n"
}
