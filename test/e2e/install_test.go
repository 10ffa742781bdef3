package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

const leaseName = "idc-operator.messaging.idempotency.dev"

var managerLabels = map[string]string{"app.kubernetes.io/name": "idc-operator", "app.kubernetes.io/component": "manager"}

// install: `kubectl apply --server-side -f dist/install.yaml`, then the
// manager runs as a Pod on the node, under its own ServiceAccount, holding
// the leader lease, from the image whose version is the Makefile's.
func (s *suite) install(ctx context.Context, t *testing.T) {
	// A namespace left by an earlier, interrupted run goes first.
	s.deleteNamespace(ctx, t, testNamespace)
	start := time.Now()
	if err := s.c.Install(ctx, env.install); err != nil {
		t.Fatal(err)
	}
	// The suite shortens the retention pass (status.lastPrune, lag) to 10 s,
	// the way a user would with a kustomize patch of the manager's args.
	if _, err := s.c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "patch", "deployment", localcluster.ManagerDeployment,
		"--type=json", `-p=[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--retention-period=10s"}]`); err != nil {
		t.Fatal(err)
	}
	if err := s.c.WaitManager(ctx); err != nil {
		t.Fatal(err)
	}
	pod := s.managerPod(ctx, t)
	t.Logf("installed in %s; manager:%s", time.Since(start).Round(time.Second), localcluster.DescribePods([]corev1.Pod{*pod}))
	checkOnNode(t, []corev1.Pod{*pod})
	if pod.Spec.ServiceAccountName != localcluster.ManagerSA {
		t.Fatalf("manager runs as ServiceAccount %q, want %q", pod.Spec.ServiceAccountName, localcluster.ManagerSA)
	}
	if !strings.Contains(pod.Spec.Containers[0].Image, env.image) {
		t.Fatalf("manager image %q, want %q", pod.Spec.Containers[0].Image, env.image)
	}
	s.waitLeader(ctx, t, pod.Name)

	// The image's runtime binary reports the Makefile's version (exec runs
	// it directly: the image has no shell).
	out, err := s.c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "exec", pod.Name, "--", "/idc-runtime", "version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(strings.TrimSpace(out), env.version+" ") {
		t.Fatalf("idc-runtime version in the image = %q, want %s", strings.TrimSpace(out), env.version)
	}
	t.Logf("idc-runtime version in the image: %s", strings.TrimSpace(out))

	// Not cluster-admin: the API server's own answer for the manager's identity.
	sa := "system:serviceaccount:" + localcluster.OperatorNamespace + ":" + localcluster.ManagerSA
	for _, c := range []struct {
		attrs authorizationv1.ResourceAttributes
		want  bool
	}{
		{authorizationv1.ResourceAttributes{Verb: "*", Group: "*", Resource: "*"}, false},
		{authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes"}, false},
		{authorizationv1.ResourceAttributes{Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}, false},
		{authorizationv1.ResourceAttributes{Verb: "list", Resource: "secrets", Namespace: testNamespace}, true},
		{authorizationv1.ResourceAttributes{Verb: "patch", Group: "apps", Resource: "deployments", Namespace: testNamespace}, true},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa, ResourceAttributes: &c.attrs}}
		if err := s.c.Client.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.want {
			t.Fatalf("%s may %s %s/%s = %t, want %t (%s)", sa, c.attrs.Verb, c.attrs.Group, c.attrs.Resource, sar.Status.Allowed, c.want, sar.Status.Reason)
		}
	}

	// The test namespace, restricted.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted",
	}}}
	if err := s.c.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) managerPod(ctx context.Context, t *testing.T) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		pods, err := s.c.Pods(ctx, localcluster.OperatorNamespace, managerLabels)
		if err != nil {
			return err
		}
		var live []corev1.Pod
		for _, p := range pods {
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if len(live) != 1 || !localcluster.PodReady(&live[0]) {
			return fmt.Errorf("manager pods:%s", localcluster.DescribePods(pods))
		}
		pod = &live[0]
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// waitLeader: leader election is on, and the pod holds the lease.
func (s *suite) waitLeader(ctx context.Context, t *testing.T, podName string) {
	t.Helper()
	if err := localcluster.Eventually(ctx, 2*time.Minute, func() error {
		var l coordinationv1.Lease
		if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: localcluster.OperatorNamespace, Name: leaseName}, &l); err != nil {
			return err
		}
		if h := ptr.Deref(l.Spec.HolderIdentity, ""); !strings.HasPrefix(h, podName+"_") {
			return fmt.Errorf("lease %s held by %q, want pod %s", leaseName, h, podName)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("leader lease %s held by %s", leaseName, podName)
}

func (s *suite) deleteNamespace(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := s.c.Client.Delete(ctx, ns); apierrors.IsNotFound(err) {
		return
	} else if err != nil {
		t.Fatal(err)
	}
	if err := localcluster.Eventually(ctx, 3*time.Minute, func() error {
		err := s.c.Client.Get(ctx, client.ObjectKey{Name: name}, &corev1.Namespace{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("namespace %s still there (%w)", name, err)
	}); err != nil {
		t.Fatal(err)
	}
}

// restrictedNamespace: the namespace really enforces `restricted`: a pod
// that asks for root is refused at admission, so every runtime pod that does
// run there passed the same check.
func (s *suite) restrictedNamespace(ctx context.Context, t *testing.T) {
	bad := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "runs-as-root"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: env.image, Command: []string{"/idc-runtime", "version"},
			SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)},
		}}},
	}
	err := s.c.Client.Create(ctx, bad)
	if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted`) {
		t.Fatalf("a root pod without seccomp in %s: err = %v, want a PodSecurity rejection", testNamespace, err)
	}
	t.Logf("the API server refused a non-compliant pod: %v", err)
}

// metricsAuth: the manager's /metrics (HTTPS, through its Service's
// ClusterIP and kube-proxy) answers a ServiceAccount bound to the
// metrics-reader role, and refuses an anonymous request and an unbound one.
func (s *suite) metricsAuth(ctx context.Context, t *testing.T) {
	cs, err := kubernetes.NewForConfig(s.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"metrics-scraper", "no-metrics"} {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: name}}
		if err := s.c.Client.Create(ctx, sa); err != nil {
			t.Fatal(err)
		}
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "idc-e2e-metrics-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "idc-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: testNamespace, Name: "metrics-scraper"}},
	}
	_ = s.c.Client.Delete(ctx, crb)
	if err := s.c.Client.Create(ctx, crb); err != nil {
		t.Fatal(err)
	}
	s.parent.Cleanup(func() { _ = s.c.Client.Delete(context.Background(), crb) })
	token := func(sa string) string {
		tr, err := cs.CoreV1().ServiceAccounts(testNamespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	var svc corev1.Service
	if err := s.c.Client.Get(ctx, client.ObjectKey{Namespace: localcluster.OperatorNamespace, Name: "idc-controller-manager-metrics-service"}, &svc); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("https://%s:8443/metrics", svc.Spec.ClusterIP)
	// The manager's serving certificate is self-signed (controller-runtime
	// generates it); what is under test is authn/authz, not the certificate.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	get := func(tok string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	good := token("metrics-scraper")
	var code int
	var body string
	// kube-proxy programs the ClusterIP within a few seconds of the Service.
	if err := localcluster.Eventually(ctx, time.Minute, func() error {
		var err error
		code, body, err = get(good)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d: %.200s", code, body)
		}
		return err
	}); err != nil {
		t.Fatalf("scraping %s as the bound ServiceAccount: %v", url, err)
	}
	if !strings.Contains(body, "controller_runtime_reconcile_total") {
		t.Fatalf("the manager's metrics lack controller_runtime_reconcile_total:\n%.500s", body)
	}
	if code, _, err := get(""); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("anonymous scrape: status %d err %v, want 401", code, err)
	}
	if code, _, err := get(token("no-metrics")); err != nil || code != http.StatusForbidden {
		t.Fatalf("scrape by an unbound ServiceAccount: status %d err %v, want 403", code, err)
	}
	t.Logf("GET %s: 200 for the metrics-reader binding, 401 anonymous, 403 unbound", url)
}

// rbacNeverForbidden: through the whole suite the authorizer never refused
// a request of the manager's ServiceAccount (the node's audit log records
// every request with the authorizer's decision): the generated Role grants
// every verb the manager uses.
func (s *suite) rbacNeverForbidden(_ context.Context, t *testing.T) {
	f, err := os.Open(env.auditLog)
	if err != nil {
		t.Fatalf("the node's audit log: %v", err)
	}
	defer func() { _ = f.Close() }()
	user := "system:serviceaccount:" + localcluster.OperatorNamespace + ":" + localcluster.ManagerSA
	var total, admission int
	var forbidden []string
	verbs := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1024*1024), 16*1024*1024)
	for sc.Scan() {
		var ev struct {
			Verb       string `json:"verb"`
			RequestURI string `json:"requestURI"`
			User       struct {
				Username string `json:"username"`
			} `json:"user"`
			ObjectRef *struct {
				Resource, Namespace string
			} `json:"objectRef"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			Annotations map[string]string `json:"annotations"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.User.Username != user {
			continue
		}
		total++
		if ev.ObjectRef != nil {
			verbs[ev.Verb+" "+ev.ObjectRef.Resource]++
		}
		// The authorizer's own verdict: a 403 from admission (say, a
		// namespace being terminated) is not an RBAC gap.
		if ev.Annotations["authorization.k8s.io/decision"] == "forbid" {
			forbidden = append(forbidden, ev.Verb+" "+ev.RequestURI+": "+ev.Annotations["authorization.k8s.io/reason"])
		} else if ev.ResponseStatus != nil && ev.ResponseStatus.Code == http.StatusForbidden {
			admission++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if total < 100 {
		t.Fatalf("only %d audited requests by %s: the audit log does not cover the suite", total, user)
	}
	if len(forbidden) > 0 {
		t.Fatalf("%d requests of the manager were forbidden (the generated RBAC lacks them):\n%s", len(forbidden), strings.Join(forbidden, "\n"))
	}
	t.Logf("%d requests by %s, none forbidden by RBAC (%d refused by admission, e.g. in a terminating namespace); verbs used: %v", total, user, admission, verbs)
}
