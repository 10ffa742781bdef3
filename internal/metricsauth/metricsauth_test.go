package metricsauth

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/idempotency-dev/idc-operator/internal/testenv"
)

// countingTransport counts the review requests the guard sends.
type countingTransport struct {
	next           http.RoundTripper
	tokens, access atomic.Int32
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case req.Method == http.MethodPost && req.URL.Path == "/apis/authentication.k8s.io/v1/tokenreviews":
		c.tokens.Add(1)
	case req.Method == http.MethodPost && req.URL.Path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		c.access.Add(1)
	}
	return c.next.RoundTrip(req)
}

// TestGuardAgainstARealAPIServer runs the filter in front of a handler with
// envtest's kube-apiserver answering the reviews: a ServiceAccount granted
// get on /metrics reads it, one without the grant gets 403, a made-up or
// missing token 401, and repeated scrapes are answered from the cache.
func TestGuardAgainstARealAPIServer(t *testing.T) {
	env, err := testenv.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("while starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(cfg)

	const ns = "default"
	for _, sa := range []string{"scraper", "nosy"} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "scraper", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
			Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("while requesting a token for %s: %v", sa, err)
		}
		return tr.Status.Token
	}

	counter := &countingTransport{}
	guardCfg := rest.CopyConfig(cfg)
	guardCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter })
	httpClient, err := rest.HTTPClientFor(guardCfg)
	if err != nil {
		t.Fatal(err)
	}
	filter, err := New(guardCfg, httpClient)
	if err != nil {
		t.Fatal(err)
	}
	handler, err := filter(logr.Discard(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "idc_up 1\n")
	}))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)

	get := func(path, bearer string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	scraper, nosy := token("scraper"), token("nosy")
	cases := []struct {
		name, path, token string
		want              int
	}{
		{"granted ServiceAccount", "/metrics", scraper, http.StatusOK},
		{"granted ServiceAccount, again (cached)", "/metrics", scraper, http.StatusOK},
		{"granted ServiceAccount on another path", "/debug", scraper, http.StatusForbidden},
		{"ServiceAccount without the grant", "/metrics", nosy, http.StatusForbidden},
		{"made-up token", "/metrics", "not-a-token", http.StatusUnauthorized},
		{"no token", "/metrics", "", http.StatusUnauthorized},
	}
	for _, c := range cases {
		code, body := get(c.path, c.token)
		if code != c.want {
			t.Errorf("%s: GET %s = %d %q, want %d", c.name, c.path, code, body, c.want)
		}
		if c.want == http.StatusOK && body != "idc_up 1\n" {
			t.Errorf("%s: body %q, want the handler's", c.name, body)
		}
	}
	// Three tokens were reviewed (scraper, nosy, the made-up one) and three
	// access questions asked (scraper on /metrics and /debug, nosy): the
	// second scrape asked nothing.
	if got := counter.tokens.Load(); got != 3 {
		t.Errorf("%d TokenReviews, want 3 (one per distinct token; the repeat from the cache)", got)
	}
	if got := counter.access.Load(); got != 3 {
		t.Errorf("%d SubjectAccessReviews, want 3 (one per distinct user and path)", got)
	}
}

// TestCacheExpiresAndStaysBounded drives the cache with a fake clock.
func TestCacheExpiresAndStaysBounded(t *testing.T) {
	c := newCache[bool]()
	now := time.Unix(1_000_000, 0)
	c.put("a", true, now, time.Minute)
	if v, ok := c.get("a", now.Add(59*time.Second)); !ok || !v {
		t.Fatalf("get before expiry = %v, %v; want true, true", v, ok)
	}
	if _, ok := c.get("a", now.Add(time.Minute)); ok {
		t.Fatal("an entry is served at its expiry")
	}
	for i := range maxEntries + 10 {
		c.put(fmt.Sprint(i), true, now, time.Duration(i+1)*time.Second)
	}
	if n := c.len(); n != maxEntries {
		t.Fatalf("cache holds %d entries, want %d", n, maxEntries)
	}
	// The entries that expire first were dropped; the newest are kept.
	if _, ok := c.get(fmt.Sprint(maxEntries+9), now); !ok {
		t.Error("the newest entry was dropped")
	}
	if _, ok := c.get("1", now); ok {
		t.Error("an entry that expires first survived a full cache")
	}
}
