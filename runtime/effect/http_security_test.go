package effect

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// A 3xx is a failed call with its reason, never followed: the redirect
// target (another server here) is not called, neither for 302 nor for the
// body-resending 307 and 308, inline or through the outbox caller.
func TestHTTPEffectFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(other.Close)
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+"/charge", code)
		}))
		cfg := &config.HTTP{URL: srv.URL, Method: http.MethodPost, Timeout: config.Duration{Duration: 2 * time.Second}}
		e, err := New(config.Effect{HTTP: cfg}, "s", nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Apply(context.Background(), nil, []*Record{rec("key-1", `{"n":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Failed) != 1 || res.Failed[0].Retryable || !errors.Is(res.Failed[0].Err, ErrHTTPStatus) ||
			!strings.Contains(res.Failed[0].Err.Error(), "redirect") {
			t.Fatalf("HTTP %d: %+v, want one permanent failure naming the redirect", code, res)
		}
		caller, err := NewHTTPCaller(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := caller.Call(context.Background(), "key-2", []byte(`{"n":2}`), nil); !errors.Is(err, ErrHTTPPermanent) {
			t.Fatalf("outbox caller, HTTP %d: %v, want a permanent failure", code, err)
		}
		caller.Close()
		srv.Close()
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect target was called %d times", n)
	}
}

// The deny list is enforced where the connection is made: an endpoint in a
// denied network is never reached (here loopback stands for the metadata
// address), one outside it is.
func TestHTTPEffectDenyNetworks(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	run := func(deny []string) error {
		caller, err := NewHTTPCaller(&config.HTTP{URL: srv.URL, Method: http.MethodPost, Timeout: config.Duration{Duration: 2 * time.Second}, DenyNetworks: deny})
		if err != nil {
			t.Fatal(err)
		}
		defer caller.Close()
		return caller.Call(context.Background(), "key", []byte(`{}`), nil)
	}
	err := run([]string{"169.254.0.0/16", "fe80::/10", "127.0.0.0/8"})
	if !errors.Is(err, ErrAddressDenied) || !strings.Contains(err.Error(), "127.0.0.1 is in 127.0.0.0/8") {
		t.Fatalf("a call into a denied network: %v, want ErrAddressDenied naming the address and the network", err)
	}
	if calls.Load() != 0 {
		t.Fatal("the denied endpoint was reached")
	}
	if err := run([]string{"169.254.0.0/16", "fe80::/10"}); err != nil {
		t.Fatalf("a call outside the deny list: %v", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("%d calls, want 1", calls.Load())
	}
	if _, err := NewHTTPCaller(&config.HTTP{URL: srv.URL, DenyNetworks: []string{"not-a-cidr"}}); err == nil {
		t.Fatal("a deny list entry that is no CIDR must be refused")
	}
}
