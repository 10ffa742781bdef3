package controllers

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// WatchNamespaces turns the manager's --watch-namespaces value ("a,b") into
// the cache's DefaultNamespaces: the manager then lists and watches
// IdempotentConsumers, their children and Secrets only there, which is what
// lets it run with Roles in those namespaces and no ClusterRole (the Helm
// chart's watchNamespaces). Empty means every namespace (nil).
func WatchNamespaces(list string) (map[string]cache.Config, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	out := map[string]cache.Config{}
	for _, ns := range strings.Split(list, ",") {
		ns = strings.TrimSpace(ns)
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("--watch-namespaces: %q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		out[ns] = cache.Config{}
	}
	return out, nil
}
