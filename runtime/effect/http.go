package effect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
)

// IdempotencyKeyHeader carries the message id on every http effect call; the
// remote side deduplicates on it (at-least-once call, exactly-once effect).
const IdempotencyKeyHeader = "Idempotency-Key"

// httpConcurrency bounds the calls of one batch in flight at once.
const httpConcurrency = 16

// maxErrorBody is how much of an error response is kept for the reason.
const maxErrorBody = 256

// httpEffect calls a remote endpoint per new message, outside the database
// transaction.
type httpEffect struct {
	url, method string
	timeout     time.Duration
	client      *http.Client
}

func newHTTP(cfg *config.HTTP) (*httpEffect, error) {
	method := cfg.Method
	if method == "" {
		method = http.MethodPost
	}
	timeout := cfg.Timeout.Duration
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if _, err := http.NewRequest(method, cfg.URL, nil); err != nil {
		return nil, fmt.Errorf("while building the http effect: %w", err)
	}
	// Calls run up to httpConcurrency (inline) or the dispatcher's
	// concurrency at once: keep that many connections alive, not
	// net/http's default of 2 per host.
	// net/http's defaults otherwise (proxy from the environment, dial and
	// TLS handshake timeouts, HTTP/2).
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	return &httpEffect{url: cfg.URL, method: method, timeout: timeout, client: &http.Client{Transport: transport}}, nil
}

func (h *httpEffect) Transactional() bool { return false }

// Apply calls the endpoint for every record (bounded concurrency) and reports
// each failure, classed: 4xx other than 408/429 is permanent; 5xx, 408, 429,
// timeouts and transport errors are retryable. It never returns an error.
func (h *httpEffect) Apply(ctx context.Context, _ pgx.Tx, recs []*Record) (Result, error) {
	failures := make([]*Failure, len(recs))
	sem := make(chan struct{}, httpConcurrency)
	var wg sync.WaitGroup
	for i, m := range recs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if class, err := h.call(ctx, m); err != nil {
				failures[i] = &Failure{Index: i, Err: err, Retryable: class != permanent, Outage: class == outage}
			}
		})
	}
	wg.Wait()
	var res Result
	for _, f := range failures {
		if f != nil {
			res.Failed = append(res.Failed, *f)
		}
	}
	res.Applied = len(recs) - len(res.Failed)
	return res, nil
}

// failureClass says how a failed call may be retried.
type failureClass int

const (
	permanent failureClass = iota // dead-letter
	retryable                     // the endpoint answered with a retryable status
	outage                        // the endpoint is unreachable or shedding load
)

// call returns how a failure may be retried, and the error.
func (h *httpEffect) call(ctx context.Context, m *Record) (failureClass, error) {
	if !m.ValidJSON() {
		return permanent, extract.ErrInvalidJSON
	}
	return h.do(ctx, m.ID, m.Body, nil)
}

func (h *httpEffect) do(ctx context.Context, key string, body []byte, headers map[string]string) (failureClass, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, h.method, h.url, bytes.NewReader(body))
	if err != nil {
		return permanent, fmt.Errorf("while building the http request: %w", err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(IdempotencyKeyHeader, key)
	resp, err := h.client.Do(req)
	if err != nil {
		return outage, fmt.Errorf("while calling %s %s: %w", h.method, h.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	_, _ = io.Copy(io.Discard, resp.Body) // drain so the connection is reused
	return classifyStatus(resp.StatusCode, snippet)
}

// HTTPCaller makes the http effect's calls for the outbox dispatcher
// (delivery: Outbox), with the same request, timeout and classing as the
// inline effect.
type HTTPCaller struct{ h *httpEffect }

// NewHTTPCaller builds the caller of cfg's endpoint.
func NewHTTPCaller(cfg *config.HTTP) (*HTTPCaller, error) {
	h, err := newHTTP(cfg)
	if err != nil {
		return nil, err
	}
	return &HTTPCaller{h: h}, nil
}

// Errors of HTTPCaller.Call besides outages (unreachable, timed out, 503,
// 429), which wrap neither.
var (
	// ErrHTTPPermanent: a 4xx other than 408 and 429; retrying cannot help.
	ErrHTTPPermanent = errors.New("refused for good")
	// ErrHTTPRetryable: a 5xx other than 503, or 408.
	ErrHTTPRetryable = errors.New("failed, retryable")
)

// Call sends body with Idempotency-Key: key and the extra headers.
func (c *HTTPCaller) Call(ctx context.Context, key string, body []byte, headers map[string]string) error {
	class, err := c.h.do(ctx, key, body, headers)
	switch {
	case err == nil:
		return nil
	case class == permanent:
		return fmt.Errorf("%w: %w", ErrHTTPPermanent, err)
	case class == retryable:
		return fmt.Errorf("%w: %w", ErrHTTPRetryable, err)
	}
	return err
}

// Close releases the idle connections.
func (c *HTTPCaller) Close() { c.h.client.CloseIdleConnections() }

// ErrHTTPStatus is wrapped by errors for non-2xx responses.
var ErrHTTPStatus = errors.New("http effect refused")

func classifyStatus(code int, body []byte) (failureClass, error) {
	if code >= 200 && code < 300 {
		return permanent, nil
	}
	err := fmt.Errorf("%w: status %d: %s", ErrHTTPStatus, code, bytes.TrimSpace(body))
	switch {
	case code == http.StatusServiceUnavailable, code == http.StatusTooManyRequests:
		return outage, err
	case code == http.StatusRequestTimeout, code >= 500:
		return retryable, err
	}
	return permanent, err
}
