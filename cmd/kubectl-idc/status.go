package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// podSummary is one runtime pod.
type podSummary struct {
	Name     string     `json:"name"`
	Ready    string     `json:"ready"`
	Phase    string     `json:"phase"`
	Restarts int32      `json:"restarts"`
	Started  *time.Time `json:"started,omitempty"`
	Node     string     `json:"node,omitempty"`
}

// statusReport is what `status` prints.
type statusReport struct {
	Name               string `json:"name"`
	Namespace          string `json:"namespace"`
	Generation         int64  `json:"generation"`
	ObservedGeneration int64  `json:"observedGeneration"`
	Source             string `json:"source,omitempty"`
	Guarantee          string `json:"guarantee,omitempty"`
	Suspended          bool   `json:"suspended,omitempty"`
	// Sink is the sink database and where the inbox lives in it:
	// "postgres, schema <s>" or "mysql (MySQL/MariaDB), database <d>".
	Sink        string                     `json:"sink"`
	Conditions  []metav1.Condition         `json:"conditions"`
	Window      windowExplanation          `json:"window"`
	Lag         *int64                     `json:"lag,omitempty"`
	Inbox       *v1alpha1.InboxStatus      `json:"inbox,omitempty"`
	LastPrune   *v1alpha1.PruneRunStatus   `json:"lastPrune,omitempty"`
	LastRedrive *v1alpha1.RedriveRunStatus `json:"lastRedrive,omitempty"`
	Outbox      *v1alpha1.OutboxStatus     `json:"outbox,omitempty"`
	// UsesOutbox: spec.emit, or an http effect delivered through the outbox.
	UsesOutbox bool                    `json:"usesOutbox"`
	Runtime    *v1alpha1.RuntimeStatus `json:"runtime,omitempty"`
	// Partitions are status.partitions (natsJetStream.partitions).
	Partitions []v1alpha1.PartitionStatus `json:"partitions,omitempty"`
	Pods       []podSummary               `json:"pods"`
}

func (a *app) statusCommand() *cobra.Command {
	return a.nameCommand("status NAME", "Conditions, the window and why, lag, last prune and redrive, outbox, pods: one screen",
		func(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer) error {
			pods, err := runtimePods(ctx, c, idc)
			if err != nil {
				return err
			}
			rep := buildStatus(idc, pods)
			return a.print(rep, func(w io.Writer) error { return renderStatus(w, rep, a.now()) })
		})
}

// runtimeSelector is status.runtime.selector, else the consumer pods' labels.
func runtimeSelector(idc *v1alpha1.IdempotentConsumer) (labels.Selector, error) {
	if rt := idc.Status.Runtime; rt != nil && rt.Selector != "" {
		sel, err := labels.Parse(rt.Selector)
		if err != nil {
			return nil, fmt.Errorf("while parsing status.runtime.selector %q: %w", rt.Selector, err)
		}
		return sel, nil
	}
	return labels.SelectorFromSet(labels.Set{"app.kubernetes.io/name": "idc-runtime", "app.kubernetes.io/instance": idc.Name,
		"app.kubernetes.io/component": "consumer"}), nil
}

func runtimePods(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer) ([]corev1.Pod, error) {
	sel, err := runtimeSelector(idc)
	if err != nil {
		return nil, err
	}
	var list corev1.PodList
	if err := c.client.List(ctx, &list, client.InNamespace(idc.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return nil, fmt.Errorf("while listing the runtime pods of %s: %w", idc.Name, err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items, nil
}

// buildStatus gathers the report; it is pure.
func buildStatus(idc *v1alpha1.IdempotentConsumer, pods []corev1.Pod) statusReport {
	st := idc.Status
	rep := statusReport{
		Name: idc.Name, Namespace: idc.Namespace, Generation: idc.Generation, ObservedGeneration: st.ObservedGeneration,
		Source: st.Source, Guarantee: string(st.Guarantee), Suspended: idc.Spec.Suspend,
		Conditions: st.Conditions, Window: explainWindow(idc), Lag: st.Lag, Inbox: st.Inbox,
		LastPrune: st.LastPrune, LastRedrive: st.LastRedrive, Outbox: st.Outbox, Runtime: st.Runtime, Partitions: st.Partitions,
		Pods: []podSummary{}, UsesOutbox: usesOutbox(idc), Sink: sinkText(&idc.Spec.Sink),
	}
	if rep.Conditions == nil {
		rep.Conditions = []metav1.Condition{}
	}
	for _, p := range pods {
		rep.Pods = append(rep.Pods, summarizePod(p))
	}
	return rep
}

func summarizePod(p corev1.Pod) podSummary {
	s := podSummary{Name: p.Name, Phase: string(p.Status.Phase), Node: p.Spec.NodeName}
	ready := 0
	for _, c := range p.Status.ContainerStatuses {
		s.Restarts += c.RestartCount
		if c.Ready {
			ready++
		}
	}
	s.Ready = fmt.Sprintf("%d/%d", ready, len(p.Spec.Containers))
	if p.DeletionTimestamp != nil {
		s.Phase = "Terminating"
	}
	if p.Status.StartTime != nil {
		t := p.Status.StartTime.UTC()
		s.Started = &t
	}
	return s
}

func renderStatus(w io.Writer, rep statusReport, now time.Time) error {
	p := &printer{w: w}
	p.f("IdempotentConsumer %s/%s (generation %d, observed %d)\n", rep.Namespace, rep.Name, rep.Generation, rep.ObservedGeneration)
	p.f("Source:       %s\n", orDefault(rep.Source, "-"))
	p.f("Guarantee:    %s\n", orDefault(rep.Guarantee, "-"))
	if rep.Suspended {
		p.f("Suspended:    yes (spec.suspend): no replicas run\n")
	}
	p.f("Sink:         %s\n", rep.Sink)
	if rep.Inbox != nil {
		p.f("Inbox:        %s (layout %s, schema v%d)\n", rep.Inbox.Table, rep.Inbox.Layout, rep.Inbox.SchemaVersion)
	}
	p.f("Window:       %s\n", orDefault(rep.Window.Window, "unknown"))
	p.f("              %s\n", rep.Window.Decided)
	if rep.Window.Pending != "" {
		p.f("              %s\n", rep.Window.Pending)
	}
	p.f("Lag:          %s\n", lagText(rep.Lag))
	p.f("Last prune:   %s\n", pruneText(rep.LastPrune, now))
	p.f("Last redrive: %s\n", redriveText(rep.LastRedrive, now))
	p.f("Outbox:       %s\n", outboxText(rep.Outbox, rep.UsesOutbox))

	p.f("\nConditions:\n")
	tw := p.table()
	p.tf(tw, "  TYPE\tSTATUS\tREASON\tAGE\tMESSAGE\n")
	for _, c := range rep.Conditions {
		p.tf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, age(now, c.LastTransitionTime.Time), excerpt(c.Message, 90))
	}
	p.flush(tw)

	if len(rep.Partitions) > 0 {
		p.f("\nPartitions:\n")
		tw = p.table()
		p.tf(tw, "  PARTITION\tDEPLOYMENT\tCONSUMER\tREADY\tLAG\n")
		for _, pt := range rep.Partitions {
			ready := fmt.Sprintf("%d/%d", pt.ReadyReplicas, pt.Replicas)
			if !pt.Ready {
				ready += " (not available)"
			}
			p.tf(tw, "  %d\t%s\t%s\t%s\t%s\n", pt.Partition, pt.Deployment, pt.Consumer, ready, lagText(pt.Lag))
		}
		p.flush(tw)
	}

	p.f("\nPods")
	switch {
	case rep.Runtime != nil && len(rep.Partitions) > 0:
		p.f(" (%d partitions' Deployments, %d/%d ready)", len(rep.Partitions), rep.Runtime.ReadyReplicas, rep.Runtime.Replicas)
	case rep.Runtime != nil:
		p.f(" (Deployment %s, %d/%d ready)", rep.Runtime.Deployment, rep.Runtime.ReadyReplicas, rep.Runtime.Replicas)
	}
	p.f(":\n")
	if len(rep.Pods) == 0 {
		p.f("  none\n")
		return p.err
	}
	tw = p.table()
	p.tf(tw, "  NAME\tREADY\tSTATUS\tRESTARTS\tAGE\n")
	for _, pod := range rep.Pods {
		var started time.Time
		if pod.Started != nil {
			started = *pod.Started
		}
		p.tf(tw, "  %s\t%s\t%s\t%d\t%s\n", pod.Name, pod.Ready, pod.Phase, pod.Restarts, age(now, started))
	}
	p.flush(tw)
	return p.err
}

func lagText(lag *int64) string {
	if lag == nil {
		return "not read yet"
	}
	return fmt.Sprintf("%d messages", *lag)
}

func pruneText(lp *v1alpha1.PruneRunStatus, now time.Time) string {
	if lp == nil || lp.Time == nil {
		return "none yet"
	}
	s := fmt.Sprintf("%s ago: %d rows deleted, %d partitions dropped", age(now, lp.Time.Time), lp.RowsDeleted, lp.PartitionsDropped)
	if lp.Cutoff != nil {
		s += ", cutoff " + lp.Cutoff.UTC().Format(time.RFC3339)
	}
	if lp.HeldBack != "" {
		s += "; held back: " + lp.HeldBack
	}
	return s
}

func redriveText(lr *v1alpha1.RedriveRunStatus, now time.Time) string {
	if lr == nil {
		return "none"
	}
	s := fmt.Sprintf("%q %s", lr.Token, lr.Phase)
	if lr.Time != nil {
		s += " " + age(now, lr.Time.Time) + " ago"
	}
	if lr.Phase != v1alpha1.RedriveRunning {
		s += ": " + redriveCounts(lr)
	}
	if lr.Message != "" {
		s += "; " + lr.Message
	}
	return s
}

func redriveCounts(lr *v1alpha1.RedriveRunStatus) string {
	return fmt.Sprintf("%d selected, %d applied, %d duplicates, %d stale, %d still failing, %d without a usable id, %d outbox events requeued",
		lr.Selected, lr.Applied, lr.Duplicates, lr.Stale, lr.StillFailing, lr.Unusable, lr.Requeued)
}

// sinkText names the sink database and where the inbox's tables are.
func sinkText(s *v1alpha1.SinkSpec) string {
	if s.Kind() == v1alpha1.SinkKindMySQL {
		return "mysql (MySQL/MariaDB), database " + s.Schema()
	}
	return "postgres, schema " + s.Schema()
}

func usesOutbox(idc *v1alpha1.IdempotentConsumer) bool {
	h := idc.Spec.Sink.Effect.HTTP
	return idc.Spec.Emit != nil || (h != nil && h.Delivery == v1alpha1.HTTPDeliveryOutbox)
}

func outboxText(o *v1alpha1.OutboxStatus, used bool) string {
	switch {
	case !used:
		return "not used (no spec.emit, no http delivery: Outbox)"
	case o == nil:
		return "not read yet"
	}
	return fmt.Sprintf("%d pending, oldest %s", o.Pending, o.OldestAge.Duration)
}
