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

	"github.com/idempotency-dev/idc-operator/internal/specs"
)

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
