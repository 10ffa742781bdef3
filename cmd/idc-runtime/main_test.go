package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/runtime/consumer"
	"github.com/idempotency-dev/idc-operator/runtime/retention"
)

func TestChooseWindow(t *testing.T) {
	unbounded := fmt.Errorf("while reading: %w", retention.ErrUnboundedReplay)
	unreachable := fmt.Errorf("while reading: %w", retention.ErrBrokerUnreachable)
	res := func(d time.Duration) retention.Result { return retention.Result{Window: d} }
	cases := []struct {
		name       string
		derived    retention.Result
		deriveErr  error
		controller time.Duration
		stored     time.Duration
		want       time.Duration
		from       string
		refused    bool
	}{
		{name: "derived larger", derived: res(5 * time.Hour), controller: 3 * time.Hour, want: 5 * time.Hour, from: windowFromDerived},
		{name: "controller larger", derived: res(2 * time.Hour), controller: 3 * time.Hour, want: 3 * time.Hour, from: windowFromController},
		{name: "equal prefers derived", derived: res(3 * time.Hour), controller: 3 * time.Hour, want: 3 * time.Hour, from: windowFromDerived},
		{name: "derived only", derived: res(4 * time.Hour), want: 4 * time.Hour, from: windowFromDerived},
		{name: "broker unreachable falls back", deriveErr: unreachable, controller: time.Hour, want: time.Hour, from: windowFromController},
		{name: "broker unreachable and no flag", deriveErr: unreachable, refused: true},
		{name: "unbounded replay refuses despite flag", deriveErr: unbounded, controller: 100 * time.Hour, refused: true},
		{name: "zero window without error", derived: res(0), refused: true},
		{name: "stored larger (a pending shrink)", derived: res(time.Hour), controller: time.Hour, stored: 24 * time.Hour, want: 24 * time.Hour, from: windowFromStored},
		{name: "broker unreachable uses the stored window", deriveErr: unreachable, stored: 2 * time.Hour, want: 2 * time.Hour, from: windowFromStored},
		{name: "unbounded replay refuses despite a stored window", deriveErr: unbounded, stored: 100 * time.Hour, refused: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := chooseWindow(tc.derived, tc.deriveErr, tc.controller, tc.stored)
			if tc.refused {
				if !errors.Is(err, errRefused) {
					t.Fatalf("err = %v, want errRefused", err)
				}
				if tc.deriveErr != nil && !errors.Is(err, tc.deriveErr) {
					t.Errorf("err = %v does not carry the derivation error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.window != tc.want || c.from != tc.from {
				t.Errorf("window %s from %s, want %s from %s", c.window, c.from, tc.want, tc.from)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	if got := exitCode(nil); got != exitOK {
		t.Errorf("nil -> %d", got)
	}
	if got := exitCode(errors.New("x")); got != exitFailed {
		t.Errorf("plain error -> %d", got)
	}
	if got := exitCode(fmt.Errorf("wrapped: %w", withCode(exitRefused, errors.New("x")))); got != exitRefused {
		t.Errorf("wrapped refused -> %d", got)
	}
}

func TestDispatch(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := dispatch([]string{"version"}, &out, &errOut); code != exitOK || strings.TrimSpace(out.String()) != "dev (commit unknown)" {
		t.Errorf("version: code %d output %q", code, out.String())
	}
	cases := [][]string{
		{},
		{"bogus"},
		{"run"},
		{"run", "--config", "/nonexistent/config.json"},
		{"migrate", "--config"},
		{"prune", "--config", "/nonexistent", "--window", "soon"},
		{"run", "--config", "x", "extra"},
		{"run", "--config", "/nonexistent", "--log-level", "loud"},
	}
	for _, args := range cases {
		if code := dispatch(args, &out, &errOut); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %s)", args, code, exitUsage, errOut.String())
		}
	}
}

func TestFailpoint(t *testing.T) {
	defer func() { consumer.AfterCommitHook = nil }()
	if err := armFailpoint("", logr.Discard()); err != nil || consumer.AfterCommitHook != nil {
		t.Fatalf("empty value armed something: %v", err)
	}
	if err := armFailpoint("after-commit", logr.Discard()); exitCode(err) != exitUsage {
		t.Fatalf("unknown failpoint: %v", err)
	}
	if err := armFailpoint(failpointAfterCommit, logr.Discard()); err != nil || consumer.AfterCommitHook == nil {
		t.Fatalf("known failpoint not armed: %v", err)
	}
	defer func() { relayBeforePublish, relayAfterPublish = nil, nil }()
	if err := armFailpoint(failpointBeforeRelay, logr.Discard()); err != nil || relayBeforePublish == nil || relayAfterPublish != nil {
		t.Fatalf("relay-before-publish armed %v (before) %v (after): %v", relayBeforePublish != nil, relayAfterPublish != nil, err)
	}
	if err := armFailpoint(failpointAfterRelay, logr.Discard()); err != nil || relayAfterPublish == nil {
		t.Fatalf("relay-after-publish-before-mark not armed: %v", err)
	}
}

func TestLiveness(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newLoopState(time.Minute)
	s.now = func() time.Time { return now }
	if err := s.live(); err != nil {
		t.Fatalf("live before the loop started: %v", err)
	}
	s.touch()
	now = now.Add(s.wedgeAfter - time.Second)
	if err := s.live(); err != nil {
		t.Fatalf("live within the limit: %v", err)
	}
	now = now.Add(2 * time.Second)
	if err := s.live(); err == nil {
		t.Fatal("no error after the loop went silent past the limit")
	}
	if s.ready() == nil {
		t.Fatal("ready without a consumer")
	}
}

func TestResolveConsumerName(t *testing.T) {
	t.Setenv("POD_NAME", "orders-7d9f")
	if n, _ := resolveConsumerName("flag"); n != "flag" {
		t.Errorf("flag ignored: %s", n)
	}
	if n, _ := resolveConsumerName(""); n != "orders-7d9f" {
		t.Errorf("POD_NAME ignored: %s", n)
	}
	t.Setenv("POD_NAME", "")
	if n, err := resolveConsumerName(""); err != nil || n == "" {
		t.Errorf("host name fallback: %q %v", n, err)
	}
}
