package controllers

import (
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

// invalidChildError is a rendered child the API server refused as invalid
// (HTTP 422): the spec holds a value the schema let through but Kubernetes'
// validation of the child does not. It is no transient failure: applying
// the same rendering again is refused again, so the resource stalls with
// InvalidSpec naming the spec field, and the same rendering is not sent
// again (the reconciler's memory keeps the refusal) until the spec changes.
type invalidChildError struct {
	kind, name string
	message    string
}

func (e *invalidChildError) Error() string { return e.message }

// invalidChild is the *invalidChildError of an apply or create error the
// API server refused as invalid, nil for any other error.
func invalidChild(kind, name string, err error) *invalidChildError {
	if !apierrors.IsInvalid(err) {
		return nil
	}
	var causes []string
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Details != nil {
		for _, c := range status.Status().Details.Causes {
			if len(causes) == 3 {
				causes = append(causes, "…")
				break
			}
			field := specFieldOf(kind, c.Field)
			if field != c.Field {
				field += " (the " + kind + "'s " + c.Field + ")"
			}
			causes = append(causes, field+": "+c.Message)
		}
	}
	if len(causes) == 0 {
		causes = append(causes, "spec: "+err.Error())
	}
	return &invalidChildError{kind: kind, name: name, message: fmt.Sprintf(
		"the API server refused the %s %q rendered from the spec as invalid: %s; fix the spec field named",
		kind, name, strings.Join(causes, "; "))}
}

// podSpecPaths are where the children carry the pod spec and pod metadata.
var podSpecPaths = []string{"spec.template.", "spec.jobTemplate.spec.template."}

// podFields map a pod field the spec sets to the spec field it comes from.
var podFields = []struct{ pod, spec string }{
	{"spec.nodeSelector", "spec.runtime.nodeSelector"},
	{"spec.affinity", "spec.runtime.affinity"},
	{"spec.tolerations", "spec.runtime.tolerations"},
	{"spec.topologySpreadConstraints", "spec.runtime.topologySpreadConstraints"},
	{"spec.priorityClassName", "spec.runtime.priorityClassName"},
	{"spec.serviceAccountName", "spec.runtime.serviceAccountName"},
	{"spec.containers[0].resources", "spec.runtime.resources"},
	{"spec.containers[0].image", "spec.runtime.image"},
	{"metadata.annotations", "spec.runtime.podAnnotations"},
}

// specFieldOf names the spec field a child's field is rendered from (the
// rest of the path kept: spec.runtime.affinity.nodeAffinity...), or the
// child's field itself when no spec field maps to it.
func specFieldOf(kind, field string) string {
	for _, prefix := range podSpecPaths {
		rest, ok := strings.CutPrefix(field, prefix)
		if !ok {
			continue
		}
		for _, f := range podFields {
			if tail, ok := strings.CutPrefix(rest, f.pod); ok && (tail == "" || tail[0] == '.' || tail[0] == '[') {
				return f.spec + tail
			}
		}
	}
	switch {
	case kind == "CronJob" && field == "spec.schedule":
		return "spec.retention.prune.schedule"
	case kind == "Deployment" && field == "spec.replicas":
		return "spec.runtime.replicas"
	}
	return field
}

// childRefused stalls the pass for a child that cannot be applied as
// rendered: one another owner holds (Conflict) or one the API server
// refused as invalid (InvalidSpec). Any other error is returned, to be
// retried.
func (r *Reconciler) childRefused(s *scope, err error) error {
	var ce *conflictError
	if errors.As(err, &ce) {
		s.stall(messagingv1alpha1.ReasonConflict, ce.Error())
		return nil
	}
	var ie *invalidChildError
	if errors.As(err, &ie) {
		s.stall(messagingv1alpha1.ReasonInvalidSpec, ie.Error())
		return nil
	}
	return err
}
