package controllers

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/errtext"
)

// bannerServer is a TCP server on loopback that answers every connection
// with banner and closes it: what a resource author finds when aiming the
// operator's broker client at some port to learn what listens there.
func bannerServer(t *testing.T, banner string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write([]byte(banner))
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// A source aimed at a server that answers with a long banner: the broker
// driver quotes the reply in its error, and neither the conditions nor the
// events carry it, only a bounded, sanitized message.
func TestBannerIsNotReflectedIntoStatus(t *testing.T) {
	const marker = "OpenSSH_9.6p1-SECRET-BUILD"
	banner := "SSH-2.0-" + marker + " " + strings.Repeat("x-banner-filler ", 400) + "\r\n"
	addr := bannerServer(t, banner)
	idc := unitConsumer()
	idc.Spec.Source = messagingv1alpha1.SourceSpec{RedisStreams: &messagingv1alpha1.RedisStreamsSource{
		Address: addr, Stream: "orders", Group: "projector"}}
	h := newHarness(t, idc)
	h.r.opts.Broker = LiveBroker{}
	recorder := events.NewFakeRecorder(100)
	h.r.recorder = recorder

	// The oracle exists: the driver's own error shows the banner.
	rc, err := renderConfig(idc)
	if err != nil {
		t.Fatal(err)
	}
	_, raw := LiveBroker{}.Observe(t.Context(), rc.Config, func(string) string { return "" }, time.Now())
	if raw == nil || !strings.Contains(raw.Error(), marker) {
		t.Fatalf("the broker error %v does not carry the banner: the test would prove nothing", raw)
	}

	got, _ := h.pass()
	checked := 0
	for _, typ := range []string{messagingv1alpha1.ConditionRetentionResolved, messagingv1alpha1.ConditionBrokerLimits} {
		c := meta.FindStatusCondition(got.Status.Conditions, typ)
		if c == nil {
			t.Fatalf("no %s condition", typ)
		}
		if strings.Contains(c.Message, marker) || strings.Contains(c.Message, "x-banner-filler") {
			t.Errorf("%s carries the banner: %q", typ, c.Message)
		}
		if len(c.Message) > 2*errtext.MaxLen {
			t.Errorf("%s message is %d bytes long: %q", typ, len(c.Message), c.Message)
		}
		if !strings.Contains(c.Message, "<server text withheld>") {
			t.Errorf("%s message %q does not say the server's text was withheld", typ, c.Message)
		}
		checked++
	}
	close(recorder.Events)
	for e := range recorder.Events {
		if strings.Contains(e, marker) || strings.Contains(e, "x-banner-filler") {
			t.Errorf("an event carries the banner: %q", e)
		}
	}
	if checked != 2 {
		t.Fatalf("checked %d conditions", checked)
	}
}
