package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// A Secret is read in full once per version: passes while it is unchanged
// take its data from the memo, a rotation is read at the next pass and
// rolls the pods, and a Secret deleted is reported at once.
func TestSecretIsReadOncePerVersion(t *testing.T) {
	h := newHarness(t, unitConsumer())
	h.pass()
	h.markAvailable()
	h.pass()
	for range 3 {
		h.clk.Step(fakePeriod)
		h.pass()
	}
	h.mu.Lock()
	gets := h.secretGets
	h.mu.Unlock()
	if gets != 1 {
		t.Errorf("%d Secret GETs in 5 passes with the Secret unchanged, want 1", gets)
	}
	before := h.deploymentSecretsHash()

	ctx := context.Background()
	var sec corev1.Secret
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "db"}, &sec); err != nil {
		t.Fatal(err)
	}
	sec.Data["dsn"] = []byte("postgres://db/rotated")
	if err := h.c.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	gets = h.secretGets // with the test's own read
	h.mu.Unlock()
	h.pass()
	h.mu.Lock()
	gets = h.secretGets - gets
	h.mu.Unlock()
	if gets != 1 {
		t.Errorf("%d Secret GETs in the pass after a rotation, want 1", gets)
	}
	if got := h.sink.lastDSN(); got != "postgres://db/rotated" {
		t.Errorf("the sink was reached with %q after the rotation, want the new value", got)
	}
	if after := h.deploymentSecretsHash(); after == before {
		t.Errorf("the pods' secrets hash stayed %q after a rotation", after)
	}

	if err := h.c.Delete(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	if _, err := h.r.Reconcile(ctx, reqFor("shop", "orders")); err == nil {
		t.Fatal("a pass with the Secret deleted succeeded")
	}
	idc := &messagingv1alpha1.IdempotentConsumer{}
	if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, idc); err != nil {
		t.Fatal(err)
	}
	if got := conditionOf(idc, messagingv1alpha1.ConditionReady); got != "False/"+messagingv1alpha1.ReasonSecretNotFound {
		t.Errorf("with the Secret deleted, Ready = %s, want False/%s", got, messagingv1alpha1.ReasonSecretNotFound)
	}
}

// The rollout hash of the referenced Secrets changes when a value rotates
// and not when another key of the Secret changes; and the value cannot be
// found from it by someone who sees the pod template (view rights) but not
// the Secret: testing guesses, the real password among them, against the
// annotation finds nothing, whichever way the public inputs are hashed. Only
// with the Secret's UID (which the Secret's readers alone see) does the
// right guess match.
func TestSecretsHashRotatesWithoutRevealingTheValue(t *testing.T) {
	const password = "hunter2"
	dsn := func(pw string) []byte { return []byte("postgres://app:" + pw + "@db:5432/app") }
	h := newHarness(t, unitConsumer())
	ctx := context.Background()
	// The harness's Secret, with the UID a real API server gives it.
	if err := h.c.Delete(ctx, &corev1.Secret{ObjectMeta: metaObj("db")}); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metaObj("db"), Data: map[string][]byte{"dsn": dsn(password)}}
	secret.UID = types.UID("5f0c2a3e-8d2b-4c31-9a7e-2b6f1d0e9c44")
	if err := h.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	annotation := func() string {
		t.Helper()
		h.pass()
		var d appsv1.Deployment
		if err := h.c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: "orders"}, &d); err != nil {
			t.Fatal(err)
		}
		return d.Spec.Template.Annotations[specs.AnnotationSecretsHash]
	}
	before := annotation()
	if before == "" {
		t.Fatal("no secrets hash on the pod template")
	}

	rc, err := renderConfig(unitConsumer())
	if err != nil || len(rc.Secrets) != 1 {
		t.Fatalf("rendered secrets %v, %v", rc, err)
	}
	ref := rc.Secrets[0]
	plain := func(v []byte) string { // the unsalted scheme this replaced
		s := sha256.New()
		_, _ = fmt.Fprintf(s, "%s\x00%s\x00%s\x00%d\x00", ref.Env, ref.Ref.Name, ref.Ref.Key, len(v))
		s.Write(v)
		return hex.EncodeToString(s.Sum(nil)[:8])
	}
	keyed := func(uid types.UID, v []byte) string {
		s := sha256.New()
		s.Write(secretValueMAC(uid, ref, v))
		return hex.EncodeToString(s.Sum(nil)[:8])
	}
	for _, guess := range []string{"password", "123456", "postgres", password, "letmein"} {
		v := dsn(guess)
		if plain(v) == before || keyed("", v) == before || keyed(types.UID(ref.Ref.Name), v) == before {
			t.Fatalf("the guess %q can be confirmed from the annotation %s without the Secret", guess, before)
		}
	}
	if keyed(secret.UID, dsn(password)) != before {
		t.Fatal("the annotation is not the UID-keyed HMAC of the value: the test above proves nothing")
	}

	// Another key of the Secret changes: nothing rolls.
	secret.Data["unrelated"] = []byte("x")
	if err := h.c.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if got := annotation(); got != before {
		t.Fatalf("a change of an unreferenced key moved the hash %s -> %s", before, got)
	}
	// The referenced value rotates: the hash moves, and the pods roll.
	secret.Data["dsn"] = dsn("correct-horse-battery-staple")
	if err := h.c.Update(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if got := annotation(); got == before || got == "" {
		t.Fatalf("rotating the password left the hash at %s", got)
	}
}

func metaObj(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: "shop"} }
