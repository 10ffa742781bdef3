package controllers

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/effect"
)

// eventInsecureSkipVerify is the Warning event of a spec that turns TLS
// certificate verification off (a tls.insecureSkipVerify: true).
const eventInsecureSkipVerify = "InsecureSkipVerify"

// DefaultHTTPDenyNetworks is --http-deny-networks' default: link-local
// (IPv4 and IPv6, which hold the cloud metadata services' 169.254.169.254)
// and the metadata addresses outside it (AWS's IPv6 one, Alibaba Cloud's).
var DefaultHTTPDenyNetworks = []string{"169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128", "100.100.100.200/32"}

// imageAllowed says whether image is among the allowed runtime images: an
// exact entry, or an entry ending in * that is a prefix of it. No entries
// allow the manager's own runtime image alone.
func imageAllowed(image string, allowed []string, own string) bool {
	if len(allowed) == 0 {
		return image == own
	}
	for _, a := range allowed {
		if prefix, ok := strings.CutSuffix(a, "*"); ok && strings.HasPrefix(image, prefix) || a == image {
			return true
		}
	}
	return false
}

// imageRefusal is the Stalled message for a spec.runtime.image the manager
// may not run, or "" when it may.
func (r *Reconciler) imageRefusal(idc *messagingv1alpha1.IdempotentConsumer) string {
	image := runtimeImageFor(idc, r.opts.RuntimeImage)
	if imageAllowed(image, r.opts.AllowedRuntimeImages, r.opts.RuntimeImage) {
		return ""
	}
	allowed := r.opts.AllowedRuntimeImages
	if len(allowed) == 0 {
		allowed = []string{r.opts.RuntimeImage}
	}
	return fmt.Sprintf("spec.runtime.image %q is not an image this operator runs (allowed: %s); remove spec.runtime.image, or have the operator's administrator add it to --allowed-runtime-images (Helm value allowedRuntimeImages). Nothing was deployed with it",
		image, strings.Join(allowed, ", "))
}

// insecureTLSFields lists the tls blocks of the spec that turn certificate
// verification off.
func insecureTLSFields(idc *messagingv1alpha1.IdempotentConsumer) []string {
	var out []string
	add := func(path string, t *messagingv1alpha1.TLSSpec) {
		if t != nil && t.InsecureSkipVerify {
			out = append(out, path+".tls.insecureSkipVerify")
		}
	}
	s := idc.Spec.Source
	if s.NATSJetStream != nil {
		add("spec.source.natsJetStream", s.NATSJetStream.TLS)
	}
	if s.Kafka != nil {
		add("spec.source.kafka", s.Kafka.TLS)
	}
	if s.RabbitMQ != nil {
		add("spec.source.rabbitmq", s.RabbitMQ.TLS)
	}
	if s.RedisStreams != nil {
		add("spec.source.redisStreams", s.RedisStreams.TLS)
	}
	if e := idc.Spec.Emit; e != nil {
		if e.NATSJetStream != nil {
			add("spec.emit.natsJetStream", e.NATSJetStream.TLS)
		}
		if e.Kafka != nil {
			add("spec.emit.kafka", e.Kafka.TLS)
		}
		if e.RabbitMQ != nil {
			add("spec.emit.rabbitmq", e.RabbitMQ.TLS)
		}
		if e.RedisStreams != nil {
			add("spec.emit.redisStreams", e.RedisStreams.TLS)
		}
	}
	return out
}

// warnInsecureTLS puts a warning into the Ready condition's message while
// the spec turns certificate verification off, and raises a Warning event
// once per spec generation that does (events only on a change).
func (r *Reconciler) warnInsecureTLS(s *scope) {
	fields := insecureTLSFields(s.idc)
	if len(fields) == 0 {
		return
	}
	s.obs.warning = fmt.Sprintf("warning: TLS certificate verification is off (%s): anyone on the path can read and change the traffic and the credentials; use caSecretRef instead",
		strings.Join(fields, ", "))
	if s.before.Status.ObservedGeneration != s.idc.Generation {
		r.recorder.Eventf(s.idc, nil, corev1.EventTypeWarning, eventInsecureSkipVerify, "Render", "%s", s.obs.warning)
	}
}

func runtimeImageFor(idc *messagingv1alpha1.IdempotentConsumer, defaultImage string) string {
	if idc.Spec.Runtime.Image != "" {
		return idc.Spec.Runtime.Image
	}
	return defaultImage
}

// validateSQLParams: the statement's :name parameters and spec params must
// match both ways. CEL cannot parse SQL, so the controller checks it and
// stalls with InvalidSpec.
func validateSQLParams(cfg *config.Config) error {
	s := cfg.Sink.Effect.SQL
	if s == nil {
		return nil
	}
	_, names, err := effect.ConvertNamedParams(s.Statement)
	if err != nil {
		return fmt.Errorf("spec.sink.effect.sql.statement: %w", err)
	}
	params := make([]string, 0, len(s.Params))
	for k := range s.Params {
		params = append(params, k)
	}
	sort.Strings(params)
	for _, n := range names {
		if _, ok := s.Params[n]; !ok {
			return fmt.Errorf("spec.sink.effect.sql.statement uses :%s, which is not in spec.sink.effect.sql.params (%s)", n, strings.Join(params, ", "))
		}
	}
	for _, n := range params {
		if !slices.Contains(names, n) {
			return fmt.Errorf("spec.sink.effect.sql.params.%s is not used by the statement (no :%s in spec.sink.effect.sql.statement)", n, n)
		}
	}
	return nil
}

// renderPhase renders the runtime config; a spec that does not render
// stalls with InvalidSpec naming the field.
func (r *Reconciler) renderPhase(_ context.Context, s *scope) (ctrl.Result, error) {
	s.idc.Status.Source = sourceSummary(s.idc)
	s.idc.Status.Guarantee = guaranteeFor(s.idc)
	rc, err := renderConfig(s.idc)
	if err == nil {
		err = validateSQLParams(rc.Config)
	}
	if err == nil {
		err = rc.withHTTPDenyNetworks(r.opts.HTTPDenyNetworks)
	}
	if err != nil {
		s.stall(messagingv1alpha1.ReasonInvalidSpec, err.Error())
		return ctrl.Result{}, nil
	}
	if msg := r.imageRefusal(s.idc); msg != "" {
		s.stall(messagingv1alpha1.ReasonImageNotAllowed, msg)
		return ctrl.Result{}, nil
	}
	r.warnInsecureTLS(s)
	s.rc = rc
	return ctrl.Result{}, nil
}

func sourceSummary(idc *messagingv1alpha1.IdempotentConsumer) string {
	s := idc.Spec.Source
	switch {
	case s.NATSJetStream != nil:
		return fmt.Sprintf("NATSJetStream %s/%s", s.NATSJetStream.Stream, s.NATSJetStream.Consumer)
	case s.Kafka != nil:
		return fmt.Sprintf("Kafka %v/%s", s.Kafka.Topics, s.Kafka.ConsumerGroup)
	case s.RabbitMQ != nil:
		return "RabbitMQ " + s.RabbitMQ.Queue
	case s.RedisStreams != nil:
		return fmt.Sprintf("RedisStreams %s/%s", s.RedisStreams.Stream, s.RedisStreams.Group)
	}
	return ""
}

func guaranteeFor(idc *messagingv1alpha1.IdempotentConsumer) messagingv1alpha1.Guarantee {
	if idc.Spec.Sink.Effect.HTTP != nil {
		return messagingv1alpha1.GuaranteeAtLeastOnceWithIdempotencyKey
	}
	return messagingv1alpha1.GuaranteeExactlyOnceEffect
}
