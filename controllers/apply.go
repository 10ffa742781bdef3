package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// conflictError is a child object of the same name that another owner holds.
type conflictError struct{ kind, name, owner string }

func (e *conflictError) Error() string {
	return fmt.Sprintf("%s %q exists and is not owned by this IdempotentConsumer (owner: %s); rename or delete it", e.kind, e.name, e.owner)
}

// appliedChild is what the manager last applied for one child: the
// rendering's hash and the generation (resourceVersion for objects without
// one) the API server returned.
type appliedChild struct {
	hash    string
	version string
	// refused: the API server refused this rendering as invalid (an
	// *invalidChildError); it is not sent again.
	refused error
}

// liveVersion is what tells that someone changed a live child: its
// generation, or its resourceVersion when it has none (a ConfigMap).
func liveVersion(o client.Object) string {
	if g := o.GetGeneration(); g != 0 {
		return fmt.Sprintf("g%d", g)
	}
	return "rv" + o.GetResourceVersion()
}

// apply server-side-applies a rendered child owned by idc, unless this
// process applied the same rendering to the same live version already. It
// never applies over an object it could not read, nor over one another
// owner holds (a conflictError): a child the cache does not hold is
// created by a create-only apply, which changes no object that exists.
func (r *Reconciler) apply(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer, obj client.Object) error {
	gvk := obj.GetObjectKind().GroupVersionKind()
	if err := controllerutil.SetControllerReference(idc, obj, r.scheme); err != nil {
		return fmt.Errorf("owning %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("converting %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	un := unstructuredOf(u, gvk)
	raw, err := json.Marshal(un.Object)
	if err != nil {
		return fmt.Errorf("hashing %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	sum := sha256.Sum256(raw)
	hash := hex.EncodeToString(sum[:12])
	owner, child := client.ObjectKeyFromObject(idc), gvk.Kind+"/"+obj.GetName()
	if last, ok := r.memory.appliedChild(owner, child); ok && last.hash == hash && last.refused != nil {
		// Refused as invalid: the same rendering is refused again.
		return last.refused
	}

	existing, err := r.cachedChild(ctx, obj)
	if err != nil {
		return err
	}
	if existing == nil {
		// None of ours is in the cache (it holds every child with the
		// managed-by label), but one of the same name that someone else
		// made may exist: a create-only apply tells them apart in one
		// request, where a GET before the apply took two. A child this
		// process applied before and the cache does not hold yet is read
		// instead.
		if _, known := r.memory.appliedChild(owner, child); !known {
			if done, err := r.createChild(ctx, un, owner, child, hash); done {
				return err
			}
		}
		if existing, err = r.liveChild(ctx, obj); err != nil {
			return err
		}
	}
	if existing != nil {
		if !metav1.IsControlledBy(existing, idc) {
			holder := "none"
			if ref := metav1.GetControllerOf(existing); ref != nil {
				holder = ref.Kind + "/" + ref.Name
			}
			return &conflictError{kind: gvk.Kind, name: obj.GetName(), owner: holder}
		}
		if last, ok := r.memory.appliedChild(owner, child); ok && last.hash == hash && last.version == liveVersion(existing) {
			return nil
		}
	}
	childApplies.WithLabelValues(gvk.Kind).Inc()
	applied := un.DeepCopy()
	if err := r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(applied), fieldOwner, client.ForceOwnership); err != nil {
		if refused := invalidChild(gvk.Kind, obj.GetName(), err); refused != nil {
			r.memory.putAppliedChild(owner, child, appliedChild{hash: hash, refused: refused})
			return refused
		}
		return fmt.Errorf("applying %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	r.memory.putAppliedChild(owner, child, appliedChild{hash: hash, version: liveVersion(applied)})
	return nil
}

// createChild creates the child un by a create-only apply. done: it was
// created, or refused as invalid (err says why); otherwise one exists
// (another owner's, or ours made a moment ago) or the API server took no
// create-only apply, and the caller reads it.
func (r *Reconciler) createChild(ctx context.Context, un *unstructured.Unstructured, owner client.ObjectKey, child, hash string) (done bool, err error) {
	kind := un.GetKind()
	created := un.DeepCopy()
	created.SetResourceVersion(createOnlyVersion)
	err = r.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(created), fieldOwner, client.ForceOwnership)
	if err == nil {
		childApplies.WithLabelValues(kind).Inc()
		r.memory.putAppliedChild(owner, child, appliedChild{hash: hash, version: liveVersion(created)})
		return true, nil
	}
	// Invalid: the rendering is refused (the version is compared before an
	// existing object is validated, so this one does not exist).
	if refused := invalidChild(kind, un.GetName(), err); refused != nil {
		childApplies.WithLabelValues(kind).Inc()
		r.memory.putAppliedChild(owner, child, appliedChild{hash: hash, refused: refused})
		return true, refused
	}
	return false, nil
}

// createOnlyVersion is a resourceVersion no stored object has (the
// largest the API server parses): an apply that carries it creates the
// object when there is none and is refused with a Conflict when one
// exists, without changing it. A resourceVersion is not a managed field,
// and the API server sets its own on create, so the object created is the
// same as a plain apply's.
const createOnlyVersion = "18446744073709551615"

// cachedChild reads a child from the cache; nil means the cache holds none.
func (r *Reconciler) cachedChild(ctx context.Context, obj client.Object) (client.Object, error) {
	return r.readChildFrom(ctx, r.client, obj)
}

// liveChild reads a child from the API server: the cache holds only
// objects with the operator's managed-by label, so one of the same name
// that someone else created is seen only there. nil means there is none.
func (r *Reconciler) liveChild(ctx context.Context, obj client.Object) (client.Object, error) {
	return r.readChildFrom(ctx, r.live, obj)
}

func (r *Reconciler) readChildFrom(ctx context.Context, from client.Reader, obj client.Object) (client.Object, error) {
	gvk := obj.GetObjectKind().GroupVersionKind()
	existing := obj.DeepCopyObject().(client.Object)
	err := from.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading %s %s before applying it: %w", gvk.Kind, obj.GetName(), err)
	}
	return existing, nil
}

func unstructuredOf(obj map[string]any, gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: obj}
	u.SetGroupVersionKind(gvk)
	// Fields the server owns must not be part of an apply request.
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u
}

// applyOrRemove applies obj when wanted, else deletes the live one when this
// resource controls it.
func (r *Reconciler) applyOrRemove(ctx context.Context, s *scope, obj client.Object, want bool) error {
	if want {
		if err := r.apply(ctx, s.idc, obj); err != nil {
			return r.childRefused(s, err)
		}
		return nil
	}
	// Only the cache is asked: a child this resource made carries the
	// managed-by label the cache selects on, so one the cache lacks is not
	// ours to delete, and a pass reads nothing from the API server for a
	// child it does not want (a GET per pass and resource otherwise).
	existing := obj.DeepCopyObject().(client.Object)
	if err := r.client.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil || !metav1.IsControlledBy(existing, s.idc) {
		return client.IgnoreNotFound(err)
	}
	if err := r.client.Delete(ctx, existing); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting %s %s: %w", obj.GetObjectKind().GroupVersionKind().Kind, obj.GetName(), err)
	}
	r.memory.forgetChild(client.ObjectKeyFromObject(s.idc), obj.GetObjectKind().GroupVersionKind().Kind+"/"+obj.GetName())
	return nil
}
