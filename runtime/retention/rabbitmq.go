package retention

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/brokerconn"
	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// rabbitDefaultConsumerTimeout is RabbitMQ's default consumer_timeout: a
// delivery left unacknowledged that long closes the channel and requeues it.
const rabbitDefaultConsumerTimeout = 30 * time.Minute

// rabbitQuorumDefaultLimit is the delivery-limit RabbitMQ 4.0 and later
// apply to quorum queues that set none (3.x: unlimited).
const rabbitQuorumDefaultLimit = 20

type rabbitInspector struct {
	cfg    *config.RabbitMQ
	getenv Getenv
	dial   brokerconn.Dialer
	// consumerTimeout is the declared broker consumer_timeout (0: default,
	// negative: disabled).
	consumerTimeout time.Duration
}

// rabbitAPI is an authenticated management API client.
type rabbitAPI struct {
	*brokerconn.Management
}

// rabbitSession is one management API client (its keep-alive connection
// serves every call) and the queue's answer, read once per session.
type rabbitSession struct {
	*rabbitInspector
	vhost string
	api   *rabbitAPI
	queue json.RawMessage
}

// rabbitQueue is the part of GET /api/queues/{vhost}/{name} that matters.
type rabbitQueue struct {
	Name            string          `json:"name"`
	Vhost           string          `json:"vhost"`
	Type            string          `json:"type"`
	Policy          string          `json:"policy"`
	OperatorPolicy  string          `json:"operator_policy"`
	Arguments       json.RawMessage `json:"arguments"`
	EffectivePolicy json.RawMessage `json:"effective_policy_definition"`
}

// open builds the management API client with the credentials of the AMQP
// URI: managementURL, or the AMQP host on the management plugin's default
// port. Nothing is dialled until the first call.
func (r *rabbitInspector) open(context.Context) (session, error) {
	_, uri, err := brokerconn.AMQPURI(r.cfg.URIEnv, r.getenv)
	if err != nil {
		return nil, err
	}
	m, err := brokerconn.NewManagement(r.cfg.ManagementURL, uri, r.cfg.TLS, r.getenv, r.dial)
	if err != nil {
		return nil, err
	}
	return &rabbitSession{rabbitInspector: r, vhost: uri.Vhost, api: &rabbitAPI{m}}, nil
}

func (r *rabbitSession) close() { r.api.Close() }

// readQueue decodes GET /api/queues/{vhost}/{name} into out. The queue is
// read once per session: inspect, lag and settle of one session see the
// same answer.
func (r *rabbitSession) readQueue(ctx context.Context, out any) error {
	path := "/api/queues/" + url.PathEscape(r.vhost) + "/" + url.PathEscape(r.cfg.Queue)
	if r.queue == nil {
		var raw json.RawMessage
		if err := r.api.get(ctx, path, &raw); err != nil {
			return rabbitQueueError(err, r.cfg.Queue, r.vhost)
		}
		r.queue = raw
	}
	if err := json.Unmarshal(r.queue, out); err != nil {
		return fmt.Errorf("while decoding the management API answer to GET %s: %w", path, err)
	}
	return nil
}

// inspect reads the queue's arguments and effective policy.
func (r *rabbitSession) inspect(ctx context.Context) (Observation, error) {
	var q rabbitQueue
	if err := r.readQueue(ctx, &q); err != nil {
		return Observation{}, err
	}
	s, err := r.settings(ctx, r.api, q)
	if err != nil {
		return Observation{}, err
	}
	obs := rabbitObservation(q, s)
	obs.Info = append(obs.Info, "read over the management API at "+brokerconn.RedactURL(r.api.Base)+" ("+r.api.Origin+")")
	return obs, nil
}

// errHTTPNotFound marks a 404 from the management API.
var errHTTPNotFound = errors.New("HTTP 404 Not Found")

func (a *rabbitAPI) get(ctx context.Context, path string, out any) error {
	req, err := a.NewRequest(ctx, path)
	if err != nil {
		return err
	}
	resp, err := a.Do(req)
	if err != nil {
		// The URL in the error carries no credentials: they are in a header.
		return unreachable("calling the RabbitMQ management API", err)
	}
	defer func() {
		// Read to the end, so the connection serves the next call.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
	}()
	if err := rabbitStatusError(resp, path); err != nil {
		return err
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(out); err != nil {
		return fmt.Errorf("while decoding the management API answer to GET %s: %w", path, err)
	}
	return nil
}

func rabbitStatusError(resp *http.Response, path string) error {
	switch c := resp.StatusCode; {
	case c == http.StatusOK:
		return nil
	case c == http.StatusNotFound:
		return errHTTPNotFound
	case c == http.StatusUnauthorized || c == http.StatusForbidden:
		return fmt.Errorf("the RabbitMQ management API refused the credentials of the AMQP URI for GET %s (HTTP %d); the user needs the monitoring or management tag", path, c)
	case c >= 500:
		return unreachable("calling the RabbitMQ management API", fmt.Errorf("GET %s: HTTP %d", path, c))
	case c >= 300 && c < 400:
		return fmt.Errorf("the RabbitMQ management API answered GET %s with a redirect (HTTP %d), which is not followed: set managementURL to the API itself", path, c)
	}
	return fmt.Errorf("unexpected answer from the RabbitMQ management API to GET %s: HTTP %d", path, resp.StatusCode)
}

func rabbitQueueError(err error, queue, vhost string) error {
	if errors.Is(err, errHTTPNotFound) {
		return fmt.Errorf("%w: RabbitMQ queue %q in vhost %q", ErrSourceNotFound, queue, vhost)
	}
	return fmt.Errorf("while reading RabbitMQ queue %q in vhost %q: %w", queue, vhost, err)
}

// rabbitValue is one setting and where it came from; set is false when
// neither the queue arguments nor the policy define it.
type rabbitValue[T cmp.Ordered] struct {
	v      T
	origin string
	set    bool
}

// rabbitSettings are the queue settings the formula reads.
type rabbitSettings struct {
	ttl             rabbitValue[time.Duration]
	maxAge          rabbitValue[time.Duration]
	maxAgeRaw       string
	deliveryLimit   rabbitValue[int64]
	consumerTimeout rabbitValue[time.Duration]
	// quorumDefaultLimit is the delivery-limit the broker version applies
	// to a quorum queue without one (0: unlimited).
	quorumDefaultLimit int64
	version            string
}

func (r *rabbitInspector) settings(ctx context.Context, api *rabbitAPI, q rabbitQueue) (rabbitSettings, error) {
	args, err := decodeObject(q.Arguments)
	if err != nil {
		return rabbitSettings{}, fmt.Errorf("while reading the arguments of queue %q: %w", q.Name, err)
	}
	pol, err := decodeObject(q.EffectivePolicy)
	if err != nil {
		return rabbitSettings{}, fmt.Errorf("while reading the effective policy of queue %q: %w", q.Name, err)
	}
	src := rabbitSources{args: args, policy: pol, policyName: policyName(q)}
	var s rabbitSettings
	var errs []error
	s.ttl, err = pick(src, "x-message-ttl", "message-ttl", parseMillis)
	errs = append(errs, err)
	s.maxAge, err = pick(src, "x-max-age", "max-age", ParseRabbitMaxAge)
	errs = append(errs, err)
	s.maxAgeRaw = rawString(args, pol, "x-max-age", "max-age")
	s.deliveryLimit, err = pick(src, "x-delivery-limit", "delivery-limit", parseInt)
	errs = append(errs, err)
	s.consumerTimeout, err = pick(src, "x-consumer-timeout", "consumer-timeout", parseMillis)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return rabbitSettings{}, fmt.Errorf("while reading the settings of queue %q: %w", q.Name, err)
	}
	r.defaultConsumerTimeout(&s)
	if q.Type == "quorum" && !s.deliveryLimit.set {
		if err := s.readVersion(ctx, api); err != nil {
			return rabbitSettings{}, err
		}
	}
	return s, nil
}

func (r *rabbitInspector) defaultConsumerTimeout(s *rabbitSettings) {
	switch {
	case s.consumerTimeout.set:
	case r.consumerTimeout > 0:
		s.consumerTimeout = rabbitValue[time.Duration]{v: r.consumerTimeout, origin: "spec: retention.consumerTimeout", set: true}
	case r.consumerTimeout < 0:
		s.consumerTimeout = rabbitValue[time.Duration]{origin: "spec: retention.consumerTimeout is negative"}
	default:
		s.consumerTimeout = rabbitValue[time.Duration]{v: rabbitDefaultConsumerTimeout, set: true,
			origin: "broker default; the management API does not expose consumer_timeout, declare retention.consumerTimeout if it differs"}
	}
}

// readVersion learns the delivery-limit default of quorum queues, which
// changed in RabbitMQ 4.0.
func (s *rabbitSettings) readVersion(ctx context.Context, api *rabbitAPI) error {
	var ov struct {
		Version string `json:"rabbitmq_version"`
	}
	if err := api.get(ctx, "/api/overview", &ov); err != nil {
		return fmt.Errorf("while reading the RabbitMQ version: %w", err)
	}
	s.version = ov.Version
	if major, _, _ := strings.Cut(ov.Version, "."); major != "" {
		if n, err := strconv.Atoi(major); err == nil && n >= 4 {
			s.quorumDefaultLimit = rabbitQuorumDefaultLimit
		}
	}
	return nil
}

type rabbitSources struct {
	args, policy map[string]any
	policyName   string
}

// pick reads a setting from the queue arguments and the effective policy.
// When both define it RabbitMQ applies the lower value (message-ttl,
// delivery-limit, max-age), and so does pick.
func pick[T cmp.Ordered](src rabbitSources, argKey, polKey string, parse func(string) (T, error)) (rabbitValue[T], error) {
	var out rabbitValue[T]
	for _, c := range []struct {
		m      map[string]any
		key    string
		origin string
	}{
		{src.args, argKey, "queue argument " + argKey},
		{src.policy, polKey, "policy " + src.policyName + " " + polKey},
	} {
		raw, ok := c.m[c.key]
		if !ok || raw == nil {
			continue
		}
		v, err := parse(fmt.Sprint(raw))
		if err != nil {
			return out, fmt.Errorf("%s: %w", c.origin, err)
		}
		if !out.set || v < out.v {
			out = rabbitValue[T]{v: v, origin: c.origin, set: true}
		}
	}
	return out, nil
}

func rawString(args, pol map[string]any, argKey, polKey string) string {
	var parts []string
	if v, ok := args[argKey]; ok {
		parts = append(parts, fmt.Sprint(v))
	}
	if v, ok := pol[polKey]; ok {
		parts = append(parts, fmt.Sprint(v))
	}
	return strings.Join(parts, "/")
}

func policyName(q rabbitQueue) string {
	names := make([]string, 0, 2)
	for _, n := range []string{q.Policy, q.OperatorPolicy} {
		if n != "" {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "(effective)"
	}
	return strings.Join(names, "+")
}

// decodeObject reads a JSON object the management API may also write as []
// or null when empty.
func decodeObject(raw json.RawMessage) (map[string]any, error) {
	t := strings.TrimSpace(string(raw))
	if t == "" || t == "null" || t == "[]" {
		return map[string]any{}, nil
	}
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	return m, nil
}

func parseMillis(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > float64(1<<62)/float64(time.Millisecond) {
		return 0, fmt.Errorf("%q is not a number of milliseconds", s)
	}
	return time.Duration(f * float64(time.Millisecond)), nil
}

func parseInt(s string) (int64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != float64(int64(f)) {
		return 0, fmt.Errorf("%q is not an integer", s)
	}
	return int64(f), nil
}
