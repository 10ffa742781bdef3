package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // test against a loopback server
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "idc_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var ready atomic.Bool
	var liveErr atomic.Value
	liveErr.Store(errors.New(""))
	s, err := Start("127.0.0.1:0", reg, Checks{
		Ready: func() error {
			if !ready.Load() {
				return errors.New("sink misconfigured (undefined_table)")
			}
			return nil
		},
		Live: func() error {
			if e := liveErr.Load().(error); e.Error() != "" {
				return e
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	base := "http://" + s.Addr()

	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "undefined_table") {
		t.Errorf("/readyz before ready = %d %q, want 503 naming the reason", code, body)
	}
	ready.Store(true)
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz when ready = %d, want 200", code)
	}
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	liveErr.Store(errors.New("loop wedged"))
	if code, body := get(t, base+"/healthz"); code != http.StatusInternalServerError || !strings.Contains(body, "loop wedged") {
		t.Errorf("/healthz when wedged = %d %q, want 500 naming the cause", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, "idc_test_total 3") {
		t.Errorf("/metrics = %d, body lacks the counter:\n%s", code, body)
	}
}

func TestStartFailsOnBusyPort(t *testing.T) {
	s, err := Start("127.0.0.1:0", prometheus.NewRegistry(), Checks{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Shutdown(context.Background()) }()
	if _, err := Start(s.Addr(), prometheus.NewRegistry(), Checks{}); err == nil {
		t.Fatal("second Start on the same address succeeded")
	}
}

// TestReadyzNamesTheSinkKind: /readyz says which database a sink reason is
// about, held or ready.
func TestReadyzNamesTheSinkKind(t *testing.T) {
	var ready atomic.Bool
	h := Handler(prometheus.NewRegistry(), Checks{Sink: "mysql", Ready: func() error {
		if !ready.Load() {
			return errors.New("sink misconfigured (insufficient_privilege)")
		}
		return nil
	}})
	s := httptest.NewServer(h)
	defer s.Close()
	if code, body := get(t, s.URL+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready (sink mysql): sink misconfigured (insufficient_privilege)\n" {
		t.Errorf("/readyz held = %d %q, want 503 naming the sink kind and the reason", code, body)
	}
	ready.Store(true)
	if code, body := get(t, s.URL+"/readyz"); code != http.StatusOK || body != "ok (sink mysql)\n" {
		t.Errorf("/readyz ready = %d %q, want 200 \"ok (sink mysql)\"", code, body)
	}
}
