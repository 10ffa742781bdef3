package controllers

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/cache"
)

func TestWatchNamespaces(t *testing.T) {
	got, err := WatchNamespaces(" team-a, team-b ")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]cache.Config{"team-a": {}, "team-b": {}}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := WatchNamespaces(""); err != nil || got != nil {
		t.Errorf("empty: got %v, %v; want every namespace (nil)", got, err)
	}
	for _, bad := range []string{"a,,b", "Team_A", "a,b/c"} {
		if _, err := WatchNamespaces(bad); err == nil || !strings.Contains(err.Error(), "--watch-namespaces") {
			t.Errorf("%q: want an error naming --watch-namespaces, got %v", bad, err)
		}
	}
}
