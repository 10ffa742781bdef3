package effect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
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
	deny, err := parseDenyNetworks(cfg.DenyNetworks)
	if err != nil {
		return nil, err
	}
	// Calls run up to httpConcurrency (inline) or the dispatcher's
	// concurrency at once: keep that many connections alive, not
	// net/http's default of 2 per host.
	// net/http's defaults otherwise (proxy from the environment, dial and
	// TLS handshake timeouts, HTTP/2).
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64
	// The deny list is checked where the connection is made, on the address
	// DNS resolved to: a name that points at a metadata address is refused
	// too. net/http's default dialer settings otherwise.
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: deny.control}
	transport.DialContext = dialer.DialContext
	client := &http.Client{Transport: transport, CheckRedirect: refuseRedirect}
	return &httpEffect{url: cfg.URL, method: method, timeout: timeout, client: client}, nil
}

// refuseRedirect follows no redirect: it would send the message (and the
// Idempotency-Key) to a place the resource did not name, https to http or
// to a link-local address included, and 307/308 would send the body again.
// The 3xx itself is returned, and classifyStatus fails the call with it.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// ErrAddressDenied is a connection refused by the deny list.
var ErrAddressDenied = errors.New("address denied by the manager's --http-deny-networks")

// denyNetworks is the parsed deny list.
type denyNetworks []netip.Prefix

func parseDenyNetworks(cidrs []string) (denyNetworks, error) {
	out := make(denyNetworks, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("while parsing the http deny list: %w", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// control is net.Dialer.Control: it runs after DNS, on the very address
// about to be connected.
func (d denyNetworks) control(_, address string, _ syscall.RawConn) error {
	if len(d) == 0 {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("while checking %s against the deny list: %w", address, err)
	}
	ip := ap.Addr().Unmap()
	for _, p := range d {
		if p.Contains(ip) {
			return fmt.Errorf("%w: %s is in %s", ErrAddressDenied, ip, p)
		}
	}
	return nil
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
	if code >= 300 && code < 400 {
		return permanent, fmt.Errorf("%w: status %d: a redirect, which the http effect does not follow; set spec.sink.effect.http.url to the endpoint itself", ErrHTTPStatus, code)
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
