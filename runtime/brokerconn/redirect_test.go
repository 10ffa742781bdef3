package brokerconn

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// The management API client follows no redirect: the request carries the
// AMQP credentials as Basic auth, and a redirect must not carry them (or
// the request) to a host the resource did not name.
func TestManagementFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(other.Close)
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		mgmt := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, code)
		}))
		_, uri, err := AMQPURI("U", env(map[string]string{"U": "amqp://guest:" + secret + "@127.0.0.1:5672/"}))
		if err != nil {
			t.Fatal(err)
		}
		m, err := NewManagement(mgmt.URL, uri, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		req, err := m.NewRequest(context.Background(), "/api/queues/%2F/orders")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := m.Do(req)
		if err != nil {
			t.Fatalf("HTTP %d: %v, want the redirect response itself", code, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != code {
			t.Errorf("got HTTP %d, want the %d unfollowed", resp.StatusCode, code)
		}
		m.Close()
		mgmt.Close()
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect target was called %d times", n)
	}
}
