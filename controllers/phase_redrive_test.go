package controllers

import (
	"slices"
	"strings"
	"testing"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
)

func TestRedriveIDsAnnotation(t *testing.T) {
	for _, tc := range []struct {
		value   string
		want    []string
		wantErr string
	}{
		{value: "", want: nil},
		{value: `["o-1","o,2"]`, want: []string{"o-1", "o,2"}},
		{value: `o-1,o-2`, wantErr: "JSON array"},
		{value: `["o-1",""]`, wantErr: "id 1 is empty"},
		{value: `[` + strings.Repeat(`"x",`, maxRedriveIDs) + `"x"]`, wantErr: "at most"},
	} {
		got, err := redriveIDs(tc.value)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%.40q: error %v, want one containing %q", tc.value, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.value, got, err, tc.want)
		}
	}
}

func TestRedriveFilterNamesTheRefusedAnnotation(t *testing.T) {
	idc := &messagingv1alpha1.IdempotentConsumer{}
	idc.Annotations = map[string]string{messagingv1alpha1.AnnotationRedriveReason: "database", messagingv1alpha1.AnnotationRedriveIDs: `["a"]`}
	if reason, ids, refused := redriveFilter(idc); reason != "database" || !slices.Equal(ids, []string{"a"}) || refused != "" {
		t.Errorf("a good filter: %q %v %q", reason, ids, refused)
	}
	idc.Annotations[messagingv1alpha1.AnnotationRedriveReason] = "poison"
	if _, _, refused := redriveFilter(idc); !strings.Contains(refused, messagingv1alpha1.AnnotationRedriveReason) {
		t.Errorf("an unknown reason: %q", refused)
	}
	idc.Annotations[messagingv1alpha1.AnnotationRedriveReason] = ""
	idc.Annotations[messagingv1alpha1.AnnotationRedriveIDs] = "a,b"
	if _, _, refused := redriveFilter(idc); !strings.Contains(refused, messagingv1alpha1.AnnotationRedriveIDs) || !strings.Contains(refused, "nothing was redriven") {
		t.Errorf("ids that are no JSON array: %q", refused)
	}
}
