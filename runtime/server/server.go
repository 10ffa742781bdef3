// Package server serves the consumer pod's /metrics, /healthz and /readyz
// endpoints on one address (the container's "metrics" port, which the
// Deployment's probes and a ServiceMonitor both use).
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readHeaderTimeout bounds slow clients; the endpoints answer from memory.
const readHeaderTimeout = 5 * time.Second

// Checks are the probes' answers. Both are called on every request and must
// be cheap and safe for concurrent use.
type Checks struct {
	// Live returns nil while the process is making progress; an error makes
	// /healthz answer 500 with the error text, so the kubelet restarts the
	// container. Nil means always live.
	Live func() error
	// Ready returns nil while the pod should receive work (/readyz); an
	// error makes /readyz answer 503 with the error text (the reason). Nil
	// means never ready.
	Ready func() error
	// Sink names the sink database's kind ("postgres", "mysql"): /readyz
	// says it beside its answer, so a 503 read at 3 a.m. tells which
	// database a sink reason is about.
	Sink string
}

// sinkNote is " (sink <kind>)", or "" when the kind is not set.
func (c Checks) sinkNote() string {
	if c.Sink == "" {
		return ""
	}
	return " (sink " + c.Sink + ")"
}

// Server is the HTTP server of the probes and metrics.
type Server struct {
	srv *http.Server
	ln  net.Listener
	err chan error
}

// Handler builds the mux; exposed so tests can drive it without a socket.
func Handler(gatherer prometheus.Gatherer, checks Checks) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if checks.Live != nil {
			if err := checks.Live(); err != nil {
				http.Error(w, "not live: "+err.Error(), http.StatusInternalServerError)
				return
			}
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if checks.Ready == nil {
			http.Error(w, "not ready"+checks.sinkNote(), http.StatusServiceUnavailable)
			return
		}
		if err := checks.Ready(); err != nil {
			http.Error(w, "not ready"+checks.sinkNote()+": "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok"+checks.sinkNote())
	})
	return mux
}

// Start listens on addr at once (so a port clash fails the start, not a
// later probe) and serves in the background.
func Start(addr string, gatherer prometheus.Gatherer, checks Checks) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("while listening on %s for metrics and health: %w", addr, err)
	}
	s := &Server{
		srv: &http.Server{Handler: Handler(gatherer, checks), ReadHeaderTimeout: readHeaderTimeout},
		ln:  ln,
		err: make(chan error, 1),
	}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err <- fmt.Errorf("while serving metrics and health: %w", err)
		}
		close(s.err)
	}()
	return s, nil
}

// Addr is the address actually listened on (useful with ":0").
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Err delivers the error that stopped serving, if any; it is closed when
// serving ends.
func (s *Server) Err() <-chan error { return s.err }

// Shutdown stops accepting requests and waits for those in flight.
func (s *Server) Shutdown(ctx context.Context) error {
	if err := s.srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("while shutting the metrics and health server down: %w", err)
	}
	return nil
}
