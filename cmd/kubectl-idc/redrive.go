package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/deadletterflags"
)

type redriveOptions struct {
	reason  string
	ids     []string
	dryRun  bool
	wait    bool
	timeout time.Duration
}

// redriveRequest is what `redrive` asked for (and, with --wait, how it
// ended).
type redriveRequest struct {
	Token  string   `json:"token"`
	Reason string   `json:"reason,omitempty"`
	IDs    []string `json:"ids,omitempty"`
	DryRun bool     `json:"dryRun,omitempty"`
	// Annotations are the ones set (or, with --dry-run, that would be).
	Annotations map[string]*string `json:"annotations"`
	// WouldSelect (--dry-run) is how many dead letters the filter selects now.
	WouldSelect *int64 `json:"wouldSelect,omitempty"`
	// Outcome is status.lastRedrive once it ended (--wait).
	Outcome *v1alpha1.RedriveRunStatus `json:"outcome,omitempty"`
}

func (o *redriveOptions) validate() error {
	if err := checkSelection(deadletterflags.Selection{Reasons: reasons(o.reason), IDs: o.ids}); err != nil {
		return err
	}
	if o.timeout <= 0 {
		return usagef("--timeout must be positive, got %s", o.timeout)
	}
	return nil
}

// newToken is a fresh annotation value: when, and a random part so two
// engineers at the same second never share one.
func newToken(now time.Time) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "kubectl-idc-" + now.UTC().Format("20060102t150405z") + "-" + hex.EncodeToString(b)
}

// redriveAnnotations are the annotations of one redrive; nil values remove
// a filter left by an earlier one.
func redriveAnnotations(token string, o redriveOptions) (map[string]*string, error) {
	ann := map[string]*string{v1alpha1.AnnotationRedrive: &token, v1alpha1.AnnotationRedriveReason: nil, v1alpha1.AnnotationRedriveIDs: nil}
	if o.reason != "" {
		ann[v1alpha1.AnnotationRedriveReason] = &o.reason
	}
	if len(o.ids) > 0 {
		b, err := json.Marshal(o.ids)
		if err != nil {
			return nil, fmt.Errorf("while encoding the ids: %w", err)
		}
		s := string(b)
		ann[v1alpha1.AnnotationRedriveIDs] = &s
	}
	return ann, nil
}

func (a *app) redriveCommand() *cobra.Command {
	var o redriveOptions
	cmd := a.nameCommand("redrive NAME", "Replay the dead letters exactly once (sets the redrive annotation; --wait follows status.lastRedrive)",
		func(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer) error {
			return a.redrive(ctx, c, idc, o)
		})
	cmd.Long = `redrive sets the messaging.idempotency.dev/redrive annotation to a fresh token
(with the reason and ids annotations as a filter). The controller then runs one
redrive Job for it: each selected dead letter goes through the claim and the effect
again, exactly once. --wait follows status.lastRedrive until the Job ended and prints
its counts. --dry-run changes nothing: it prints the annotations it would set and how
many dead letters the filter selects now (read by a short-lived Job, like deadletters).`
	cmd.Flags().StringVar(&o.reason, "reason", "", "redrive only this reason class: "+deadletterflags.ReasonClasses())
	cmd.Flags().StringArrayVar(&o.ids, "id", nil, "redrive only the dead letters of this message id (repeatable)")
	cmd.Flags().BoolVar(&o.dryRun, "dry-run", false, "change nothing: print the annotations and how many dead letters would be selected")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait for the redrive to end and print its outcome (exit 1 if it failed)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 5*time.Minute, "how long --wait (and --dry-run's Job) may take")
	completeReasons(cmd)
	return cmd
}

func (a *app) redrive(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer, o redriveOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	token := newToken(a.now())
	ann, err := redriveAnnotations(token, o)
	if err != nil {
		return err
	}
	req := redriveRequest{Token: token, Reason: o.reason, IDs: o.ids, DryRun: o.dryRun, Annotations: ann}
	if o.dryRun {
		ctx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		listing, err := a.gatherDeadLetters(ctx, c, idc, deadLetterQuery{reason: o.reason, ids: o.ids, limit: 1})
		if err != nil {
			return err
		}
		req.WouldSelect = &listing.Total
		return a.print(req, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "dry run: would set %s=%s (reason %q, ids %v); %d dead letters match now; nothing was changed\n",
				v1alpha1.AnnotationRedrive, token, o.reason, o.ids, listing.Total)
			return err
		})
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return fmt.Errorf("while encoding the patch: %w", err)
	}
	if err := c.client.Patch(ctx, idc, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("while setting the redrive annotation on %s: %w", idc.Name, err)
	}
	if !o.wait {
		return a.print(req, func(w io.Writer) error {
			_, err := fmt.Fprintf(w, "redrive %q requested for %s/%s; follow it with `kubectl idc status %s` (Last redrive), or pass --wait\n",
				token, idc.Namespace, idc.Name, idc.Name)
			return err
		})
	}
	outcome, err := a.waitRedrive(ctx, c, client.ObjectKeyFromObject(idc), token, o.timeout)
	if err != nil {
		return err
	}
	req.Outcome = outcome
	if err := a.print(req, func(w io.Writer) error {
		p := &printer{w: w}
		p.f("redrive %q %s (Job %s): %s\n", token, outcome.Phase, orDefault(outcome.Job, "-"), redriveCounts(outcome))
		if outcome.Message != "" {
			p.f("%s\n", outcome.Message)
		}
		return p.err
	}); err != nil {
		return err
	}
	if outcome.Phase == v1alpha1.RedriveFailed {
		return fmt.Errorf("redrive %q failed: %s", token, outcome.Message)
	}
	return nil
}

// waitRedrive polls status.lastRedrive until the token's run ended.
func (a *app) waitRedrive(ctx context.Context, c *clients, key client.ObjectKey, token string, timeout time.Duration) (*v1alpha1.RedriveRunStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(a.poll)
	defer tick.Stop()
	last := "not started yet"
	for {
		idc := &v1alpha1.IdempotentConsumer{}
		if err := c.client.Get(ctx, key, idc); err != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("while reading %s: %w", key, err)
		}
		if lr := idc.Status.LastRedrive; lr != nil && lr.Token == token {
			if lr.Phase != v1alpha1.RedriveRunning {
				return lr, nil
			}
			last = "running as Job " + lr.Job
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("redrive %q did not end within %s (%s)", token, timeout, last)
		case <-tick.C:
		}
	}
}
