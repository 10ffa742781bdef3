// Package metricsauth guards the manager's /metrics endpoint the way
// controller-runtime's filters.WithAuthenticationAndAuthorization does: the
// request's bearer token is authenticated with a TokenReview and the user it
// names is authorized for the request's verb on its path with a
// SubjectAccessReview, both answered by the kube-apiserver and cached.
//
// It exists because that filter builds on k8s.io/apiserver's delegating
// authenticator and authorizer, which bring CEL, gRPC, OpenTelemetry and the
// apiserver's own metrics into the manager for two API calls (how many
// packages and megabytes: docs/security.md; what it cost in memory:
// docs/benchmarks.md).
package metricsauth

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The cache lifetimes are controller-runtime's: an authenticated token for a
// minute (never past the token's own exp, see tokenExpiry), an allowed
// request for five, a denied one for thirty seconds (an RBAC grant a person
// just made shows within that). They are also the revocation delays: a
// token revoked (its pod or Secret deleted) reads /metrics for up to
// tokenTTL more, a user whose grant was removed for up to allowTTL.
const (
	tokenTTL     = time.Minute
	badTokenTTL  = 10 * time.Second
	allowTTL     = 5 * time.Minute
	denyTTL      = 30 * time.Second
	reviewTimout = 10 * time.Second
	// maxEntries bounds each cache: scrapers are few, a flood of made-up
	// tokens must not grow the manager's memory.
	maxEntries = 1024
)

// retry is the apiserver's webhook retry backoff, which controller-runtime's
// filter copies: a review that fails (not one that answers no) is retried
// for about 4 s before the scrape gets a 500.
var retry = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// New returns the metrics server's filter. The manager needs create on
// tokenreviews and subjectaccessreviews; a scraper needs get on the
// non-resource URL /metrics.
func New(cfg *rest.Config, httpClient *http.Client) (metricsserver.Filter, error) {
	authn, err := authnclient.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	authz, err := authzclient.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	g := &guard{tokens: authn.TokenReviews(), access: authz.SubjectAccessReviews(), now: time.Now,
		users: newCache[*authnv1.UserInfo](), decisions: newCache[bool]()}
	return g.filter, nil
}

type guard struct {
	tokens    authnclient.TokenReviewInterface
	access    authzclient.SubjectAccessReviewInterface
	now       func() time.Time
	users     *ttlCache[*authnv1.UserInfo] // nil: the token was refused
	decisions *ttlCache[bool]
	// tokenReviews and accessReviews let one review per cache key run at
	// a time: concurrent scrapes with one new token (or one user) share
	// its answer instead of each asking the kube-apiserver.
	tokenReviews, accessReviews singleflight.Group
}

func (g *guard) filter(log logr.Logger, next http.Handler) (http.Handler, error) {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		token, ok := bearer(req)
		if !ok {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		user, err := g.authenticate(req.Context(), token)
		if err != nil {
			log.Error(err, "Authentication failed")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if user == nil {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(req.Method)
		allowed, err := g.authorize(req.Context(), user, verb, req.URL.Path)
		if err != nil {
			msg := fmt.Sprintf("Authorization for user %s failed", user.Username)
			log.Error(err, msg)
			http.Error(w, msg, http.StatusInternalServerError)
			return
		}
		if !allowed {
			log.V(4).Info("Authorization denied", "user", user.Username, "verb", verb, "path", req.URL.Path)
			http.Error(w, fmt.Sprintf("Authorization denied for user %s", user.Username), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, req)
	}), nil
}

// bearer is the request's bearer token, if it has one.
func bearer(req *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(req.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "bearer") && token != ""
}

// authenticate returns the token's user, nil when the kube-apiserver
// refused the token, or an error when it could not be asked.
func (g *guard) authenticate(ctx context.Context, token string) (*authnv1.UserInfo, error) {
	sum := sha256.Sum256([]byte(token)) // the cache never holds a token
	key := string(sum[:])
	now := g.now()
	if user, ok := g.users.get(key, now); ok {
		return user, nil
	}
	return shared(ctx, &g.tokenReviews, key, func(ctx context.Context) (*authnv1.UserInfo, error) {
		// A review that ended after this caller missed the cache answered.
		if user, ok := g.users.get(key, now); ok {
			return user, nil
		}
		var review *authnv1.TokenReview
		err := withRetry(ctx, func(ctx context.Context) (err error) {
			review, err = g.tokens.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("while reviewing the token: %w", err)
		}
		if !review.Status.Authenticated {
			g.users.put(key, nil, now, badTokenTTL)
			return nil, nil
		}
		user := review.Status.User
		ttl := tokenTTL
		if exp, ok := tokenExpiry(token); ok {
			ttl = min(ttl, exp.Sub(now))
		}
		if ttl > 0 {
			g.users.put(key, &user, now, ttl)
		}
		return &user, nil
	})
}

// tokenExpiry reads the exp claim of a JWT without verifying it, only to
// bound how long the token's review is believed: a TokenReview's status
// carries no expiry. It is read after the kube-apiserver authenticated the
// token, whose signature covers exp (ServiceAccount and OIDC tokens), and it
// can only shorten the cache lifetime, never extend it. A token that is no
// JWT (a static token, an opaque webhook token) has none: tokenTTL applies.
func tokenExpiry(token string) (time.Time, bool) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp *float64 `json:"exp"` // NumericDate: seconds, maybe fractional
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == nil {
		return time.Time{}, false
	}
	sec, frac := math.Modf(*claims.Exp)
	return time.Unix(int64(sec), int64(frac*1e9)), true
}

// authorize asks whether the user may use verb on the non-resource path.
func (g *guard) authorize(ctx context.Context, user *authnv1.UserInfo, verb, path string) (bool, error) {
	groups := slices.Sorted(slices.Values(user.Groups))
	key := strings.Join(append([]string{user.Username, user.UID, verb, path}, groups...), "\x00")
	if len(user.Extra) > 0 {
		key += fmt.Sprintf("\x00%v", user.Extra) // fmt sorts map keys
	}
	now := g.now()
	if allowed, ok := g.decisions.get(key, now); ok {
		return allowed, nil
	}
	return shared(ctx, &g.accessReviews, key, func(ctx context.Context) (bool, error) {
		if allowed, ok := g.decisions.get(key, now); ok {
			return allowed, nil
		}
		extra := make(map[string]authzv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			extra[k] = authzv1.ExtraValue(v)
		}
		var review *authzv1.SubjectAccessReview
		err := withRetry(ctx, func(ctx context.Context) (err error) {
			review, err = g.access.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
				User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
				NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
			}}, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return false, fmt.Errorf("while reviewing access to %s %s: %w", verb, path, err)
		}
		allowed := review.Status.Allowed && !review.Status.Denied
		ttl := denyTTL
		if allowed {
			ttl = allowTTL
		}
		g.decisions.put(key, allowed, now, ttl)
		return allowed, nil
	})
}

// shared runs review once for all the callers that ask for key while it
// runs. It runs without the first caller's cancellation (a scraper that
// hangs up must not fail the others; withRetry bounds it), and each caller
// stops waiting when its own request ends.
func shared[V any](ctx context.Context, group *singleflight.Group, key string, review func(context.Context) (V, error)) (V, error) {
	done := group.DoChan(key, func() (any, error) { return review(context.WithoutCancel(ctx)) })
	select {
	case r := <-done:
		v, _ := r.Val.(V)
		return v, r.Err
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// withRetry runs call with a timeout, retrying a failed call on the
// backoff while the request lasts.
func withRetry(ctx context.Context, call func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, retry, func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, reviewTimout)
		defer cancel()
		last = call(cctx)
		return last == nil, nil
	})
	if last != nil {
		return last
	}
	if err != nil && !wait.Interrupted(err) {
		return err
	}
	return nil
}

// ttlCache is a small map whose entries expire; at maxEntries it drops the
// expired ones, then the one that expires first.
type ttlCache[V any] struct {
	mu      sync.Mutex
	entries map[string]ttlEntry[V]
}

type ttlEntry[V any] struct {
	v       V
	expires time.Time
}

func newCache[V any]() *ttlCache[V] { return &ttlCache[V]{entries: map[string]ttlEntry[V]{}} }

func (c *ttlCache[V]) get(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || !now.Before(e.expires) {
		var zero V
		return zero, false
	}
	return e.v, true
}

func (c *ttlCache[V]) put(key string, v V, now time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= maxEntries {
		first := ""
		for k, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, k)
			} else if first == "" || e.expires.Before(c.entries[first].expires) {
				first = k
			}
		}
		if len(c.entries) >= maxEntries {
			delete(c.entries, first)
		}
	}
	c.entries[key] = ttlEntry[V]{v: v, expires: now.Add(ttl)}
}

func (c *ttlCache[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
