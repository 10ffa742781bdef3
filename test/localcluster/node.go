// Package localcluster is the harness shared by the e2e suite and `make
// demo`: a client for the real single-node cluster that `make node-up`
// starts (hack/node.sh: kubelet, private containerd, CNI bridge), the
// operator installed from dist/install.yaml with the node's kubectl, the
// machine's services as pods see them (on the bridge gateway IP), and the
// JetStream -> PostgreSQL orders scenario both of them run.
package localcluster

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/specs"
)

// BridgeIP is the node's bridge gateway: the API server, the kubelet and the
// socat forwards of the machine's services listen there, and it is the only
// host address pods reach.
const BridgeIP = "10.88.0.1"

// OperatorNamespace and ManagerDeployment are where dist/install.yaml puts
// the manager.
const (
	OperatorNamespace = "idc-system"
	ManagerDeployment = "idc-controller-manager"
	ManagerSA         = "idc-controller-manager"
)

// IdempotentConsumers is the resource of the API, for Table requests.
var IdempotentConsumers = schema.GroupVersionResource{Group: messagingv1alpha1.GroupVersion.Group, Version: messagingv1alpha1.GroupVersion.Version, Resource: "idempotentconsumers"}

// Scheme knows the core, apps, batch, CRD and IdempotentConsumer kinds.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(messagingv1alpha1.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	return s
}

// Cluster is the running node, seen as its admin.
type Cluster struct {
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Client reads and writes directly (no cache).
	Client client.Client
	// Kubeconfig is the admin kubeconfig file; Kubectl the node's kubectl.
	Kubeconfig, Kubectl string
}

// Connect opens the node from its admin kubeconfig (hack/node.sh kubeconfig).
func Connect(kubeconfig, kubectl string) (*Cluster, error) {
	if kubeconfig == "" {
		return nil, fmt.Errorf("no kubeconfig for the real node: start it with `make node-up` (hack/node.sh up prints the path)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	if kubectl == "" {
		kubectl = "kubectl"
	}
	return &Cluster{Config: cfg, Client: c, Kubeconfig: kubeconfig, Kubectl: kubectl}, nil
}

// KubectlCmd runs the node's kubectl with the admin kubeconfig and returns
// its combined output.
func (c *Cluster) KubectlCmd(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.Kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// Install applies the install manifest server-side (the platform engineer's
// first step) and waits for the manager to be available.
func (c *Cluster) Install(ctx context.Context, installYAML string) error {
	if _, err := os.Stat(installYAML); err != nil {
		return fmt.Errorf("the install manifest: %w (make build-installer writes it)", err)
	}
	if _, err := c.KubectlCmd(ctx, "apply", "--server-side", "--force-conflicts", "-f", installYAML); err != nil {
		return err
	}
	return c.WaitManager(ctx)
}

// WaitManager waits until the manager Deployment has rolled out.
func (c *Cluster) WaitManager(ctx context.Context) error {
	_, err := c.KubectlCmd(ctx, "-n", OperatorNamespace, "rollout", "status", "deployment/"+ManagerDeployment, "--timeout=180s")
	return err
}

// Pods lists the pods matching the labels in the namespace, by name.
func (c *Cluster) Pods(ctx context.Context, namespace string, labels map[string]string) ([]corev1.Pod, error) {
	var pl corev1.PodList
	if err := c.Client.List(ctx, &pl, client.InNamespace(namespace), client.MatchingLabels(labels)); err != nil {
		return nil, err
	}
	sort.Slice(pl.Items, func(i, j int) bool { return pl.Items[i].Name < pl.Items[j].Name })
	return pl.Items, nil
}

// ConsumerPods are the running (not terminating) runtime pods of a resource.
func (c *Cluster) ConsumerPods(ctx context.Context, idc *messagingv1alpha1.IdempotentConsumer) ([]corev1.Pod, error) {
	// Every partition's pods of a partitioned resource (one Deployment each).
	pods, err := c.Pods(ctx, idc.Namespace, specs.ConsumerSelector(idc))
	if err != nil {
		return nil, err
	}
	live := pods[:0]
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live, nil
}

// DescribePods is one line per pod: phase, readiness, node, scheduler,
// restarts and the image digest the kubelet runs.
func DescribePods(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		ready, restarts, image := false, int32(0), ""
		for _, cs := range p.Status.ContainerStatuses {
			ready, restarts, image = cs.Ready, restarts+cs.RestartCount, cs.ImageID
		}
		phase := string(p.Status.Phase)
		if p.DeletionTimestamp != nil {
			phase += ",terminating"
		}
		fmt.Fprintf(&b, "\n  %-52s %-9s ready=%-5t node=%s scheduler=%s ip=%s restarts=%d image=%s",
			p.Name, phase, ready, p.Spec.NodeName, p.Spec.SchedulerName, p.Status.PodIP, restarts, image)
	}
	return b.String()
}

// PodReady says whether every container of the pod is ready.
func PodReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, cs := range p.Status.ContainerStatuses {
		if !cs.Ready {
			return false
		}
	}
	return true
}

// Metrics sums the idc_* samples (all label values of a name added up) over
// the runtime pods' metrics ports (8080), reached on the pod IPs: the host
// is on the bridge.
func Metrics(ctx context.Context, pods []corev1.Pod) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range pods {
		if p.Status.PodIP == "" {
			continue
		}
		if err := scrape(ctx, http.DefaultClient, "http://"+p.Status.PodIP+":8080/metrics", "", out); err != nil {
			return out, fmt.Errorf("scraping pod %s: %w", p.Name, err)
		}
	}
	return out, nil
}

// Eventually polls cond every 500ms until it returns nil or the timeout
// passes; it returns the last error.
func Eventually(ctx context.Context, timeout time.Duration, cond func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %s: %w", timeout, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}
