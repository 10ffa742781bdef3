// Package v1alpha1 contains the IdempotentConsumer API of the
// messaging.idempotency.dev group.
// +kubebuilder:object:generate=true
// +groupName=messaging.idempotency.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "messaging.idempotency.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a scheme. It
	// depends on apimachinery only, so the API package stays light to import.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &IdempotentConsumer{}, &IdempotentConsumerList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
