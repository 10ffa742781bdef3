package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/deadletterflags"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
)

const (
	// deadLettersContainer names the Job's container and component label.
	deadLettersContainer = "deadletters"
	// deadLetterListKind marks the listing among the container's log lines
	// (idc-runtime deadletters prints it).
	deadLetterListKind = "DeadLetterList"
	// jobDeadline bounds the Job on the server side as well.
	jobDeadline = 5 * time.Minute
)

type deadLetterQuery struct {
	reason string
	ids    []string
	limit  int
}

// deadLetterOutput is what `deadletters` prints.
type deadLetterOutput struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Inbox     string `json:"inbox,omitempty"`
	inbox.DeadLetterListing
}

func (q deadLetterQuery) validate() error {
	return checkSelection(deadletterflags.Selection{Reasons: reasons(q.reason), IDs: q.ids, Limit: q.limit})
}

// checkSelection checks the dead-letter flags as idc-runtime does
// (internal/deadletterflags); a bad value is a usage error.
func checkSelection(s deadletterflags.Selection) error {
	if _, err := s.Filter(time.Time{}); err != nil {
		return &usageError{err: err}
	}
	return nil
}

// completeReasons completes --reason with the reason classes.
func completeReasons(cmd *cobra.Command) {
	_ = cmd.RegisterFlagCompletionFunc("reason", func(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return inbox.DeadLetterClasses, cobra.ShellCompDirectiveNoFileComp
	})
}

// reasons is the one --reason as a list; none when it is empty.
func reasons(reason string) []string {
	if reason == "" {
		return nil
	}
	return []string{reason}
}

func (a *app) deadLettersCommand() *cobra.Command {
	var q deadLetterQuery
	var timeout time.Duration
	cmd := a.nameCommand("deadletters NAME", "List the dead letters (read in the cluster by a short-lived Job; no credential leaves it)",
		func(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer) error {
			if err := q.validate(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			listing, inboxName, err := a.gatherDeadLettersIn(ctx, c, idc, q)
			if err != nil {
				return err
			}
			out := deadLetterOutput{Name: idc.Name, Namespace: idc.Namespace, Inbox: inboxName, DeadLetterListing: listing}
			return a.print(out, func(w io.Writer) error { return renderDeadLetters(w, out, q, a.now()) })
		})
	cmd.Long = `deadletters lists the dead letters of an IdempotentConsumer: id, message id, reason
class, when it was dead-lettered, attempts and an excerpt of the error, oldest first.
It runs "idc-runtime deadletters" in a short-lived Job built from the resource's prune
CronJob (same image, config, Secret and restricted security context), reads the Job's
log and deletes the Job. You need RBAC to read the CronJob, create and delete Jobs,
and read pods and their logs in the namespace.`
	cmd.Flags().StringVar(&q.reason, "reason", "", "only this reason class: "+deadletterflags.ReasonClasses())
	cmd.Flags().StringArrayVar(&q.ids, "id", nil, "only this message id (repeatable)")
	cmd.Flags().IntVar(&q.limit, "limit", 50, "show at most this many, oldest first (0: all); the total is counted without it")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long the Job may take")
	completeReasons(cmd)
	return cmd
}

func (a *app) gatherDeadLetters(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer, q deadLetterQuery) (inbox.DeadLetterListing, error) {
	l, _, err := a.gatherDeadLettersIn(ctx, c, idc, q)
	return l, err
}

// gatherDeadLettersIn runs the listing Job, reads its log and deletes it.
func (a *app) gatherDeadLettersIn(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer, q deadLetterQuery) (inbox.DeadLetterListing, string, error) {
	var cj batchv1.CronJob
	key := client.ObjectKey{Namespace: idc.Namespace, Name: idc.Name + "-prune"}
	if err := c.client.Get(ctx, key, &cj); err != nil {
		return inbox.DeadLetterListing{}, "", fmt.Errorf("while reading CronJob %s (its pod template, with the resource's config and Secret, runs the listing): %w", key.Name, err)
	}
	job, err := deadLettersJob(idc, &cj, q, jobName(idc.Name))
	if err != nil {
		return inbox.DeadLetterListing{}, "", err
	}
	if err := c.client.Create(ctx, job); err != nil {
		return inbox.DeadLetterListing{}, "", fmt.Errorf("while creating Job %s: %w", job.Name, err)
	}
	defer func() {
		// The Job is gone when the command ends, whatever happened; its
		// TTL is the backstop should this delete not get through.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = c.client.Delete(dctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground))
	}()
	succeeded, err := a.waitJob(ctx, c, client.ObjectKeyFromObject(job))
	if err != nil {
		return inbox.DeadLetterListing{}, "", err
	}
	logs, err := jobLogs(ctx, c, job)
	if err != nil {
		return inbox.DeadLetterListing{}, "", err
	}
	if !succeeded {
		return inbox.DeadLetterListing{}, "", fmt.Errorf("job %s failed; its log:\n%s", job.Name, tail(logs, 10))
	}
	return parseListing(logs)
}

// jobName is <name>-deadletters-<random>, within 63 characters.
func jobName(name string) string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	suffix := "-deadletters-" + hex.EncodeToString(b)
	if len(name)+len(suffix) > 63 {
		name = name[:63-len(suffix)]
	}
	return name + suffix
}

// deadLettersJob renders the listing Job from the prune CronJob's pod
// template: the same image, ConfigMap, Secret references and restricted
// security context, another command. It is pure.
func deadLettersJob(idc *v1alpha1.IdempotentConsumer, cj *batchv1.CronJob, q deadLetterQuery, name string) (*batchv1.Job, error) {
	tmpl := cj.Spec.JobTemplate.Spec.Template.DeepCopy()
	if len(tmpl.Spec.Containers) != 1 {
		return nil, fmt.Errorf("CronJob %s has %d containers; expected the one prune container", cj.Name, len(tmpl.Spec.Containers))
	}
	ctr := &tmpl.Spec.Containers[0]
	configPath := "/etc/idc/config.json"
	if i := slices.Index(ctr.Args, "--config"); i >= 0 && i+1 < len(ctr.Args) {
		configPath = ctr.Args[i+1]
	}
	ctr.Name = deadLettersContainer
	ctr.Args = []string{"deadletters", "--config", configPath, "--limit", strconv.Itoa(q.limit)}
	if q.reason != "" {
		ctr.Args = append(ctr.Args, "--reason", q.reason)
	}
	for _, id := range q.ids {
		ctr.Args = append(ctr.Args, "--id", id)
	}
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	l := map[string]string{}
	for k, v := range tmpl.Labels {
		l[k] = v
	}
	l["app.kubernetes.io/component"] = deadLettersContainer
	tmpl.Labels = l
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: idc.Namespace, Labels: l,
			// Owned (not controlled) by the resource: deleting it removes
			// a Job left behind; the controller does not manage it.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "IdempotentConsumer", Name: idc.Name, UID: idc.UID}},
		},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptr.To(int32(0)),
			ActiveDeadlineSeconds:   ptr.To(int64(jobDeadline.Seconds())),
			TTLSecondsAfterFinished: ptr.To(int32(300)),
			Template:                *tmpl,
		},
	}, nil
}

// waitJob polls the Job until it completed or failed.
func (a *app) waitJob(ctx context.Context, c *clients, key client.ObjectKey) (bool, error) {
	tick := time.NewTicker(a.poll)
	defer tick.Stop()
	for {
		var j batchv1.Job
		if err := c.client.Get(ctx, key, &j); err != nil {
			return false, fmt.Errorf("while reading Job %s: %w", key.Name, err)
		}
		for _, cond := range j.Status.Conditions {
			if cond.Status != corev1.ConditionTrue {
				continue
			}
			switch cond.Type {
			case batchv1.JobComplete:
				return true, nil
			case batchv1.JobFailed:
				return false, nil
			}
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("job %s did not finish in time (is the image pullable, does the namespace allow the pod?): %w", key.Name, ctx.Err())
		case <-tick.C:
		}
	}
}

// jobLogs reads the log of the Job's newest pod.
func jobLogs(ctx context.Context, c *clients, job *batchv1.Job) (string, error) {
	var pods corev1.PodList
	if err := c.client.List(ctx, &pods, client.InNamespace(job.Namespace), client.MatchingLabels{batchv1.JobNameLabel: job.Name}); err != nil {
		return "", fmt.Errorf("while listing the pods of Job %s: %w", job.Name, err)
	}
	if len(pods.Items) == 0 {
		return "", fmt.Errorf("job %s has no pod to read the listing from", job.Name)
	}
	newest := slices.MaxFunc(pods.Items, func(x, y corev1.Pod) int { return x.CreationTimestamp.Compare(y.CreationTimestamp.Time) })
	b, err := c.kube.CoreV1().Pods(job.Namespace).GetLogs(newest.Name, &corev1.PodLogOptions{Container: deadLettersContainer}).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("while reading the log of pod %s: %w", newest.Name, err)
	}
	return string(b), nil
}

// parseListing finds the listing among the log lines.
func parseListing(logs string) (inbox.DeadLetterListing, string, error) {
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 0, 64*1024), 64*1024*1024)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if !bytes.Contains(line, []byte(`"kind":"`+deadLetterListKind+`"`)) {
			continue
		}
		var out struct {
			Kind  string `json:"kind"`
			Inbox string `json:"inbox"`
			inbox.DeadLetterListing
		}
		if err := json.Unmarshal(line, &out); err != nil {
			return inbox.DeadLetterListing{}, "", fmt.Errorf("while decoding the listing: %w", err)
		}
		if out.DeadLetters == nil {
			out.DeadLetters = []inbox.DeadLetterSummary{}
		}
		return out.DeadLetterListing, out.Inbox, nil
	}
	if err := sc.Err(); err != nil {
		return inbox.DeadLetterListing{}, "", fmt.Errorf("while reading the Job's log: %w", err)
	}
	return inbox.DeadLetterListing{}, "", errors.New("the Job's log holds no listing (is the runtime image older than this plugin?):\n" + tail(logs, 10))
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func renderDeadLetters(w io.Writer, out deadLetterOutput, q deadLetterQuery, now time.Time) error {
	p := &printer{w: w}
	filter := ""
	if q.reason != "" {
		filter += " reason " + q.reason
	}
	if len(q.ids) > 0 {
		filter += " ids " + strings.Join(q.ids, ",")
	}
	if filter != "" {
		filter = " (filter:" + filter + ")"
	}
	p.f("%d of %d dead letters of %s/%s in %s%s\n", len(out.DeadLetters), out.Total, out.Namespace, out.Name, orDefault(out.Inbox, "its inbox"), filter)
	if len(out.DeadLetters) == 0 {
		return p.err
	}
	tw := p.table()
	p.tf(tw, "ID\tMESSAGE ID\tREASON\tDEAD\tATTEMPTS\tERROR\n")
	for _, d := range out.DeadLetters {
		p.tf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", d.ID, orDefault(d.MessageID, "(none)"), d.ReasonClass, age(now, d.DeadAt), d.Attempts, excerpt(d.Reason, 70))
	}
	p.flush(tw)
	return p.err
}
