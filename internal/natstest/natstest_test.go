package natstest

import (
	"os"
	"strings"
	"testing"
	"time"
)

// The started server is the built release, on its own port (never the
// machine's :4222), and Stop removes its store.
func TestStartCurrent(t *testing.T) {
	s, err := StartCurrent()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.Version, "2.15.") {
		t.Errorf("started nats-server %s, want the 2.15 release hack/nats pins", s.Version)
	}
	if s.URL == SystemURL || strings.HasSuffix(s.URL, ":4222") {
		t.Errorf("started server listens on %s: the machine's port", s.URL)
	}
	if !s.Started() {
		t.Error("Started() is false for a started server")
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Errorf("the store directory %s is left after Stop: %v", s.dir, err)
	}
	if _, err := serverVersion(s.URL, time.Second); err == nil {
		t.Errorf("the server still answers at %s after Stop", s.URL)
	}
}

func TestOpenRefusesAnUnknownPick(t *testing.T) {
	t.Setenv(PickEnv, "2.9")
	if _, err := Open(Current); err == nil {
		t.Fatal("Open accepted IDC_TEST_NATS=2.9")
	}
}
