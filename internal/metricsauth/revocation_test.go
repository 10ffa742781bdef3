package metricsauth

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeClock is the guard's clock; reads counts the calls, which tell a
// test that a scrape has started (the guard reads the time before it looks
// in a cache).
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	reads atomic.Int32
}

func (c *fakeClock) now() time.Time {
	c.reads.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeAPIServer answers TokenReviews and SubjectAccessReviews from what the
// test revoked or granted, refusing a JWT past its exp as the
// kube-apiserver does, and counts the reviews.
type fakeAPIServer struct {
	clock *fakeClock
	mu    sync.Mutex
	users map[string]string // token → user; a token not there is refused
	grant map[string]bool   // user → may get /metrics
	// beforeReview, when set, runs before each review is answered.
	beforeReview          func()
	tokenReviews, reviews atomic.Int32
}

type tokenAPI struct{ *fakeAPIServer }
type accessAPI struct{ *fakeAPIServer }

func (f tokenAPI) Create(ctx context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	f.tokenReviews.Add(1)
	if f.beforeReview != nil {
		f.beforeReview()
	}
	if err := ctx.Err(); err != nil {
		return nil, err // as a client does once its request's context ended
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := tr.DeepCopy()
	user, ok := f.users[tr.Spec.Token]
	if exp, isJWT := tokenExpiry(tr.Spec.Token); isJWT && !f.clock.t.Before(exp) {
		ok = false
	}
	if ok {
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: user, UID: "uid-" + user}}
	}
	return out, nil
}

func (f accessAPI) Create(ctx context.Context, sar *authzv1.SubjectAccessReview, _ metav1.CreateOptions) (*authzv1.SubjectAccessReview, error) {
	f.reviews.Add(1)
	if f.beforeReview != nil {
		f.beforeReview()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := sar.DeepCopy()
	attrs := sar.Spec.NonResourceAttributes
	out.Status.Allowed = f.grant[sar.Spec.User] && attrs != nil && attrs.Verb == "get" && attrs.Path == "/metrics"
	return out, nil
}

func (f *fakeAPIServer) setToken(token, user string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if user == "" {
		delete(f.users, token)
	} else {
		f.users[token] = user
	}
}

func (f *fakeAPIServer) setGrant(user string, granted bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grant[user] = granted
}

func newFakeGuard() (*guard, *fakeAPIServer, *fakeClock) {
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	api := &fakeAPIServer{clock: clock, users: map[string]string{}, grant: map[string]bool{}}
	g := &guard{tokens: tokenAPI{api}, access: accessAPI{api}, now: clock.now,
		users: newCache[*authnv1.UserInfo](), decisions: newCache[bool]()}
	return g, api, clock
}

// scrape sends GET /metrics through the guard and returns the status code.
func scrape(t *testing.T, g *guard, token string) int {
	t.Helper()
	h, err := g.filter(logr.Discard(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code
}

// jwt is an unsigned token with the exp claim (the fake API server does
// not check signatures; the guard never does).
func jwt(exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(fmt.Appendf(nil, `{"sub":"scraper","exp":%d}`, exp.Unix())) + ".sig"
}

type step struct {
	after              time.Duration // since the previous step
	want               int
	tokenReviews, sars int32 // reviews sent so far
}

func run(t *testing.T, g *guard, api *fakeAPIServer, clock *fakeClock, token, what string, steps []step) {
	t.Helper()
	for _, s := range steps {
		clock.step(s.after)
		if got := scrape(t, g, token); got != s.want {
			t.Errorf("%s, %s later: %d, want %d", what, s.after, got, s.want)
		}
		if n, m := api.tokenReviews.Load(), api.reviews.Load(); n != s.tokenReviews || m != s.sars {
			t.Errorf("%s, %s later: %d TokenReviews and %d SubjectAccessReviews so far, want %d and %d", what, s.after, n, m, s.tokenReviews, s.sars)
		}
	}
}

// The delays docs/security.md states, written out so that changing a cache
// lifetime fails these tests until the documentation says the new one.
const (
	documentedTokenDelay   = time.Minute      // a revoked token
	documentedRefusedToken = 10 * time.Second // a refused token accepted again
	documentedGrantDelay   = 5 * time.Minute  // a removed RBAC grant
	documentedDenyDelay    = 30 * time.Second // a new RBAC grant after a denial
)

// A revoked token (its pod or Secret deleted) keeps reading /metrics until
// its review expires from the cache, a minute after it was made; then it
// is refused, and the refusal is cached for 10 s.
func TestRevokedTokenReadsForAMinute(t *testing.T) {
	g, api, clock := newFakeGuard()
	api.setToken("opaque", "scraper")
	api.setGrant("scraper", true)
	run(t, g, api, clock, "opaque", "valid token", []step{{0, http.StatusOK, 1, 1}})
	api.setToken("opaque", "")
	run(t, g, api, clock, "opaque", "revoked token", []step{
		{documentedTokenDelay - time.Second, http.StatusOK, 1, 1},
		{time.Second, http.StatusUnauthorized, 2, 1},
	})
	api.setToken("opaque", "scraper")
	run(t, g, api, clock, "opaque", "token valid again", []step{
		{documentedRefusedToken - time.Second, http.StatusUnauthorized, 2, 1},
		{time.Second, http.StatusOK, 3, 1},
	})
}

// A removed RBAC grant keeps its user reading /metrics until the allowed
// decision expires, 5 minutes after it was made; a grant made after a
// denial shows after 30 s.
func TestRemovedGrantReadsForFiveMinutes(t *testing.T) {
	g, api, clock := newFakeGuard()
	api.setToken("opaque", "scraper")
	api.setGrant("scraper", true)
	run(t, g, api, clock, "opaque", "granted", []step{{0, http.StatusOK, 1, 1}})
	api.setGrant("scraper", false)
	// The token's review expired meanwhile and is made again (the second
	// TokenReview); the decision is still the cached one.
	run(t, g, api, clock, "opaque", "grant removed", []step{
		{documentedGrantDelay - time.Second, http.StatusOK, 2, 1},
		{time.Second, http.StatusForbidden, 2, 2},
	})
	api.setGrant("scraper", true)
	run(t, g, api, clock, "opaque", "granted again", []step{
		{documentedDenyDelay - time.Second, http.StatusForbidden, 2, 2},
		{time.Second, http.StatusOK, 2, 3},
	})
}

// A token's review is not believed past the token's own exp: a
// ServiceAccount token that expires in 20 s is reviewed again at its
// expiry (and refused), not a minute after the first review.
func TestTokenCacheEndsAtTheTokensExpiry(t *testing.T) {
	g, api, clock := newFakeGuard()
	short := jwt(clock.t.Add(20 * time.Second))
	api.setToken(short, "scraper")
	api.setGrant("scraper", true)
	run(t, g, api, clock, short, "token expiring in 20s", []step{
		{0, http.StatusOK, 1, 1},
		{19 * time.Second, http.StatusOK, 1, 1},
		{time.Second, http.StatusUnauthorized, 2, 1},
	})
	// A token that outlives the minute is reviewed again after it.
	long := jwt(clock.t.Add(time.Hour))
	api.setToken(long, "scraper")
	run(t, g, api, clock, long, "token expiring in 1h", []step{
		{0, http.StatusOK, 3, 1},
		{documentedTokenDelay - time.Second, http.StatusOK, 3, 1},
		{time.Second, http.StatusOK, 4, 1},
	})
}

func TestTokenExpiry(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	exp := time.Unix(1_800_000_020, 0)
	cases := []struct {
		name, token string
		want        time.Time
		ok          bool
	}{
		{"JWT", jwt(exp), exp, true},
		{"fractional exp", "h." + enc([]byte(`{"exp":1800000020.5}`)) + ".s", exp.Add(500 * time.Millisecond), true},
		{"padded", "h." + base64.URLEncoding.EncodeToString([]byte(`{"exp":1800000020}`)) + ".s", exp, true},
		{"no exp", "h." + enc([]byte(`{"sub":"x"}`)) + ".s", time.Time{}, false},
		{"exp not a number", "h." + enc([]byte(`{"exp":"soon"}`)) + ".s", time.Time{}, false},
		{"payload not JSON", "h." + enc([]byte(`exp`)) + ".s", time.Time{}, false},
		{"payload not base64", "h.!!!.s", time.Time{}, false},
		{"opaque token", "abcdef0123456789", time.Time{}, false},
	}
	for _, c := range cases {
		got, ok := tokenExpiry(c.token)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("%s: tokenExpiry = %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// Concurrent scrapes with one new token send one TokenReview, and
// concurrent questions for one user one SubjectAccessReview: the review
// that runs is held until every caller has started (read the clock), so
// without the sharing each caller would send its own.
func TestConcurrentScrapesShareOneReview(t *testing.T) {
	const callers = 8
	for _, what := range []string{"TokenReview", "SubjectAccessReview"} {
		t.Run(what, func(t *testing.T) {
			g, api, clock := newFakeGuard()
			api.setToken("opaque", "scraper")
			api.setGrant("scraper", true)
			api.beforeReview = func() {
				for deadline := time.Now().Add(30 * time.Second); clock.reads.Load() < callers; time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Errorf("only %d of %d callers started", clock.reads.Load(), callers)
						return
					}
				}
			}
			user := &authnv1.UserInfo{Username: "scraper", UID: "uid-scraper"}
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() {
					var ok bool
					var err error
					if what == "TokenReview" {
						var u *authnv1.UserInfo
						u, err = g.authenticate(t.Context(), "opaque")
						ok = u != nil && u.Username == "scraper"
					} else {
						ok, err = g.authorize(t.Context(), user, "get", "/metrics")
					}
					if err != nil || !ok {
						t.Errorf("a concurrent caller got %v, %v; want the shared answer", ok, err)
					}
				})
			}
			wg.Wait()
			if n := api.tokenReviews.Load() + api.reviews.Load(); n != 1 {
				t.Errorf("%d concurrent callers sent %d reviews, want 1", callers, n)
			}
		})
	}
}

// A caller whose request ends stops waiting for the shared review, which
// still answers the others: it runs without the first caller's
// cancellation.
func TestSharedReviewOutlivesTheFirstCaller(t *testing.T) {
	g, api, _ := newFakeGuard()
	api.setToken("opaque", "scraper")
	release := make(chan struct{})
	reviewing := make(chan struct{})
	var once sync.Once
	api.beforeReview = func() { once.Do(func() { close(reviewing) }); <-release }
	ctx, cancel := context.WithCancel(t.Context())
	first := make(chan error, 1)
	go func() {
		_, err := g.authenticate(ctx, "opaque")
		first <- err
	}()
	<-reviewing
	second := make(chan *authnv1.UserInfo, 1)
	go func() {
		u, _ := g.authenticate(t.Context(), "opaque")
		second <- u
	}()
	cancel()
	if err := <-first; err == nil {
		t.Error("the caller whose request ended got no error")
	}
	close(release)
	if u := <-second; u == nil || u.Username != "scraper" {
		t.Errorf("the second caller got %+v, want the shared review's user", u)
	}
	if n := api.tokenReviews.Load(); n != 1 {
		t.Errorf("%d TokenReviews, want 1", n)
	}
}
