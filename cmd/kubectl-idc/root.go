package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/runtime/version"
)

// app is the state every command shares.
type app struct {
	stdout, stderr io.Writer
	connect        connector
	// output is -o: "" (text), json or yaml.
	output string
	now    func() time.Time
	// poll is how often --wait and the dead-letter Job are re-read.
	poll time.Duration
}

// newRootCommand builds the command tree; the app is returned for tests to
// set its clock and poll interval.
func newRootCommand(stdout, stderr io.Writer, connect connector) (*cobra.Command, *app) {
	flags := genericclioptions.NewConfigFlags(true)
	a := &app{stdout: stdout, stderr: stderr, connect: connect, now: time.Now, poll: time.Second}
	if a.connect == nil {
		a.connect = kubeconfigConnector(flags)
	}
	root := &cobra.Command{
		Use:   "kubectl-idc",
		Short: "Operate IdempotentConsumers: status, dead letters, redrive, the retention window",
		Long: `kubectl idc shows what an IdempotentConsumer is doing and runs its day-2 operations
through the API server, with your kubeconfig and RBAC. Dead letters are read by a
short-lived Job in the resource's namespace that uses the resource's own config and
Secret: no database credential leaves the cluster.`,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl idc"},
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			switch a.output {
			case "", "json", "yaml":
				return nil
			}
			return usagef("-o must be json or yaml, got %q", a.output)
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err: err} })
	flags.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVarP(&a.output, "output", "o", "", "output format: json or yaml (default: text for people)")
	root.AddCommand(a.statusCommand(), a.deadLettersCommand(), a.redriveCommand(), a.explainWindowCommand(), a.versionCommand())
	return root, a
}

// oneName is the argument check of the commands that take NAME.
func oneName(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("expected exactly one NAME (an IdempotentConsumer), got %d arguments", len(args))
	}
	return nil
}

// completeNames completes NAME with the IdempotentConsumers of the namespace.
func (a *app) completeNames(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	c, err := a.connect()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var list v1alpha1.IdempotentConsumerList
	if err := c.client.List(cmd.Context(), &list, client.InNamespace(c.namespace)); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	names := make([]cobra.Completion, 0, len(list.Items))
	for _, i := range list.Items {
		names = append(names, i.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// nameCommand is a command on one IdempotentConsumer.
func (a *app) nameCommand(use, short string, runE func(ctx context.Context, c *clients, idc *v1alpha1.IdempotentConsumer) error) *cobra.Command {
	return &cobra.Command{
		Use:               use,
		Short:             short,
		Args:              oneName,
		ValidArgsFunction: a.completeNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect()
			if err != nil {
				return err
			}
			idc := &v1alpha1.IdempotentConsumer{}
			if err := c.client.Get(cmd.Context(), client.ObjectKey{Namespace: c.namespace, Name: args[0]}, idc); err != nil {
				return fmt.Errorf("while reading IdempotentConsumer %s/%s: %w", c.namespace, args[0], err)
			}
			return runE(cmd.Context(), c, idc)
		},
	}
}

// print writes obj as -o asks, or calls text for people.
func (a *app) print(obj any, text func(w io.Writer) error) error {
	switch a.output {
	case "json":
		b, err := json.MarshalIndent(obj, "", "  ")
		if err != nil {
			return fmt.Errorf("while encoding JSON: %w", err)
		}
		_, err = fmt.Fprintln(a.stdout, string(b))
		return err
	case "yaml":
		b, err := yaml.Marshal(obj)
		if err != nil {
			return fmt.Errorf("while encoding YAML: %w", err)
		}
		_, err = a.stdout.Write(b)
		return err
	}
	return text(a.stdout)
}

// versionInfo is what `version` prints.
type versionInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return a.print(versionInfo{Version: version.Version, Commit: version.Commit}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "kubectl-idc %s\n", version.String())
				return err
			})
		},
	}
}
