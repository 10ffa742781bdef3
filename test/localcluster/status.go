package localcluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// Condition is "Status/Reason" of a condition, "" when it is not there.
func Condition(idc *messagingv1alpha1.IdempotentConsumer, typ string) string {
	c := meta.FindStatusCondition(idc.Status.Conditions, typ)
	if c == nil {
		return ""
	}
	return string(c.Status) + "/" + c.Reason
}

// WaitFor polls the resource until done says so; progress, when set, sees
// every read. It returns the last read.
func WaitFor(ctx context.Context, c client.Client, key client.ObjectKey, done func(*messagingv1alpha1.IdempotentConsumer) bool,
	progress func(*messagingv1alpha1.IdempotentConsumer)) (*messagingv1alpha1.IdempotentConsumer, error) {
	for {
		idc := &messagingv1alpha1.IdempotentConsumer{}
		err := c.Get(ctx, key, idc)
		if err == nil && progress != nil {
			progress(idc)
		}
		if err == nil && done(idc) {
			return idc, nil
		}
		select {
		case <-ctx.Done():
			return idc, errors.Join(fmt.Errorf("waiting for %s: %w (conditions: %s)", key, ctx.Err(), oneLine(idc)), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// IsReady says whether Ready is True for the current generation.
func IsReady(idc *messagingv1alpha1.IdempotentConsumer) bool {
	c := meta.FindStatusCondition(idc.Status.Conditions, messagingv1alpha1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && idc.Status.ObservedGeneration == idc.Generation
}

func oneLine(idc *messagingv1alpha1.IdempotentConsumer) string {
	parts := make([]string, 0, len(idc.Status.Conditions))
	for _, c := range idc.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
	}
	return strings.Join(parts, " ")
}

// RenderConditions prints the conditions as kubectl describe lists them.
func RenderConditions(idc *messagingv1alpha1.IdempotentConsumer) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	_, _ = fmt.Fprintln(w, "TYPE\tSTATUS\tREASON\tMESSAGE")
	for _, c := range idc.Status.Conditions {
		_, _ = fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, c.Message)
	}
	_ = w.Flush()
	return b.String()
}
