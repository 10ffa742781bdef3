// Command kubectl-idc is the kubectl plugin of idc-operator: `kubectl idc`.
// It talks to the API server only, with the user's kubeconfig and RBAC; it
// never holds database or broker credentials (dead letters are read by a
// short-lived Job in the cluster that uses the resource's own Secret).
//
// Usage:
//
//	kubectl idc status NAME
//	kubectl idc deadletters NAME [--reason CLASS] [--id ID]... [--limit N]
//	kubectl idc redrive NAME [--reason CLASS] [--id ID]... [--dry-run] [--wait]
//	kubectl idc explain-window NAME
//	kubectl idc version
//	kubectl idc completion bash|zsh|fish|powershell
//
// Every command takes kubectl's connection flags (-n, --context,
// --kubeconfig, ...) and -o json|yaml.
//
// Exit codes:
//
//	0  success
//	1  the operation failed (API error, the resource does not exist, a Job
//	   or a redrive that failed, a wait that timed out)
//	2  usage error (unknown command or flag, wrong arguments, bad value)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/internal/process"
)

// Exit codes; see the package comment.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	// Ctrl-C ends a command through its context, so the dead-letter Job it
	// created is still deleted; a second one kills at once.
	ctx, stop := process.SignalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}

// usageError marks errors of the command line (exit 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// exitCode maps an error to the exit code.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var u *usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	// cobra's own argument errors are not typed.
	if msg := err.Error(); strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag") || strings.HasPrefix(msg, "required flag") {
		return exitUsage
	}
	return exitFailed
}

// clients are what a command talks to.
type clients struct {
	// client reads and writes the IdempotentConsumer, Jobs, CronJobs, Pods.
	client client.Client
	// kube reads pod logs (controller-runtime's client does not).
	kube kubernetes.Interface
	// namespace of the command (-n, else the kubeconfig context's).
	namespace string
}

// connector makes the clients; tests pass fakes.
type connector func() (*clients, error)

// scheme knows the built-in kinds and IdempotentConsumer.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// kubeconfigConnector connects with kubectl's flags.
func kubeconfigConnector(flags *genericclioptions.ConfigFlags) connector {
	return func() (*clients, error) {
		cfg, err := flags.ToRESTConfig()
		if err != nil {
			return nil, fmt.Errorf("while reading the kubeconfig: %w", err)
		}
		ns, _, err := flags.ToRawKubeConfigLoader().Namespace()
		if err != nil {
			return nil, fmt.Errorf("while reading the namespace from the kubeconfig: %w", err)
		}
		return newClients(cfg, ns)
	}
}

func newClients(cfg *rest.Config, namespace string) (*clients, error) {
	c, err := client.New(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, fmt.Errorf("while creating the API client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("while creating the API client: %w", err)
	}
	return &clients{client: c, kube: kube, namespace: namespace}, nil
}

// run executes the command line until ctx ends and returns the exit code.
// connect nil connects with the kubeconfig flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, connect connector) int {
	root, _ := newRootCommand(stdout, stderr, connect)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "error: %v\n", err)
	}
	return exitCode(err)
}
