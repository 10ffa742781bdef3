package controllers

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// resolvedSecrets holds the credential values by env var name, for the
// controller's own connections (database, broker introspection). They are
// never logged nor written anywhere.
type resolvedSecrets struct {
	values map[string]string
	// hash of the referenced data: rotating a Secret rolls the pods. It is
	// no plain hash of the values (the pod annotation is readable by anyone
	// with view rights, who could test guesses against it offline): each
	// value enters as an HMAC-SHA256 keyed with its Secret's UID, which
	// only those who may read the Secret (and so the value) ever see.
	// Stable across manager restarts; a change of another key of the
	// Secret leaves it alone.
	hash string
}

func (s *resolvedSecrets) getenv(name string) string { return s.values[name] }

// secretError is a missing Secret or key; it carries the condition reason.
type secretError struct {
	reason, message string
}

func (e *secretError) Error() string { return e.message }

// resolveSecrets reads every referenced Secret key.
func (r *Reconciler) resolveSecrets(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, rc *renderedConfig) (*resolvedSecrets, error) {
	out := &resolvedSecrets{values: map[string]string{}}
	h := sha256.New()
	refs := append([]specs.SecretEnv(nil), rc.Secrets...)
	sort.Slice(refs, func(i, j int) bool { return refs[i].Env < refs[j].Env })
	read := map[string]*corev1.Secret{} // one GET per Secret, however many keys
	owner := types.NamespacedName{Namespace: idc.Namespace, Name: idc.Name}
	used := map[types.NamespacedName]bool{}
	// Whatever this pass read, the memo keeps the owner's use of exactly
	// those Secrets: one no longer referenced is forgotten with its last
	// user, as are all of them when the resource goes (forget).
	defer func() { r.memory.useSecrets(owner, used) }()
	for _, s := range refs {
		sec, ok := read[s.Ref.Name]
		if !ok {
			var err error
			key := types.NamespacedName{Namespace: idc.Namespace, Name: s.Ref.Name}
			used[key] = true
			sec, err = r.readSecret(ctx, key)
			if err != nil {
				if apierrors.IsNotFound(err) {
					return nil, &secretError{messagingv1alpha1.ReasonSecretNotFound,
						fmt.Sprintf("Secret %q (for %s) does not exist in namespace %q; create it", s.Ref.Name, s.Env, idc.Namespace)}
				}
				return nil, fmt.Errorf("reading Secret %q: %w", s.Ref.Name, err)
			}
			read[s.Ref.Name] = sec
		}
		v, ok := sec.Data[s.Ref.Key]
		if !ok {
			return nil, &secretError{messagingv1alpha1.ReasonSecretKeyMissing,
				fmt.Sprintf("Secret %q has no key %q (for %s)", s.Ref.Name, s.Ref.Key, s.Env)}
		}
		out.values[s.Env] = string(v)
		h.Write(secretValueMAC(sec.UID, s, v))
	}
	out.hash = hex.EncodeToString(h.Sum(nil)[:8])
	return out, nil
}

// readSecret returns the Secret, from the memo when the cached metadata
// shows the version the memo holds, else from the API server (and
// remembers it). Secrets are cached as metadata only, so without the memo
// every pass of every resource cost a GET: 4,500 in five idle minutes with
// 1,000 resources sharing one Secret.
func (r *Reconciler) readSecret(ctx context.Context, key types.NamespacedName) (*corev1.Secret, error) {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := r.client.Get(ctx, key, m); err == nil {
		if sec, ok := r.memory.secret(key, m.ResourceVersion); ok {
			return sec, nil
		}
	}
	sec := &corev1.Secret{}
	if err := r.secrets.Get(ctx, key, sec); err != nil {
		if apierrors.IsNotFound(err) {
			r.memory.dropSecret(key)
		}
		return nil, err
	}
	r.memory.putSecret(key, sec)
	return sec, nil
}

// secretValueMAC is one referenced value's part of the rollout hash:
// HMAC-SHA256 keyed with the Secret's UID over where the value goes and
// the value.
func secretValueMAC(uid types.UID, s specs.SecretEnv, value []byte) []byte {
	mac := hmac.New(sha256.New, []byte(uid))
	_, _ = fmt.Fprintf(mac, "%s\x00%s\x00%s\x00%d\x00", s.Env, s.Ref.Name, s.Ref.Key, len(value))
	mac.Write(value)
	return mac.Sum(nil)
}

// secretsPhase reads every referenced Secret key. A missing one fails the
// pass: the Secret watch brings it back when it appears, the backoff in
// case the watch is not enough.
func (r *Reconciler) secretsPhase(ctx context.Context, s *scope) (ctrl.Result, error) {
	secrets, err := r.resolveSecrets(ctx, s.idc, s.rc)
	var se *secretError
	if errors.As(err, &se) {
		s.obs.secrets = failed(se.reason, se.message)
		return ctrl.Result{}, err
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	s.secrets = secrets
	s.obs.secrets = okOutcome(messagingv1alpha1.ReasonReady, "all referenced Secrets found")
	return ctrl.Result{}, nil
}
