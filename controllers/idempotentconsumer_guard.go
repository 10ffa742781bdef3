package controllers

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
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

// withHTTPDenyNetworks puts the manager's deny list into an http effect's
// config (re-encoding it and its hash); other effects are left as they are.
func (rc *renderedConfig) withHTTPDenyNetworks(nets []string) error {
	h := rc.Config.Sink.Effect.HTTP
	if h == nil || len(nets) == 0 {
		return nil
	}
	h.DenyNetworks = append([]string(nil), nets...)
	if err := rc.Config.Validate(); err != nil {
		return fmt.Errorf("rendering the runtime config: %w", err)
	}
	return rc.encode()
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
