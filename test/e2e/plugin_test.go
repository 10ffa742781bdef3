package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	messagingv1alpha1 "github.com/idempotency-dev/idc-operator/api/v1alpha1"
	"github.com/idempotency-dev/idc-operator/test/localcluster"
)

// pluginResult is one run of the plugin binary.
type pluginResult struct {
	code           int
	stdout, stderr string
}

// plugin runs bin/kubectl-idc (make plugin) against the node, in the test
// namespace, as an on-call engineer would.
func (s *suite) plugin(ctx context.Context, t *testing.T, args ...string) pluginResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.plugin, append(args, "--kubeconfig", env.kubeconfig, "-n", testNamespace)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := pluginResult{stdout: out.String(), stderr: errOut.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("kubectl-idc %v: %v", args, err)
	}
	t.Logf("kubectl idc %s (exit %d):\n%s%s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
	return res
}

func (s *suite) pluginOK(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	res := s.plugin(ctx, t, args...)
	if res.code != 0 {
		t.Fatalf("kubectl idc %v: exit %d: %s", args, res.code, res.stderr)
	}
	return res.stdout
}

func (s *suite) pluginJSON(ctx context.Context, t *testing.T, into any, args ...string) {
	t.Helper()
	out := s.pluginOK(ctx, t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), into); err != nil {
		t.Fatalf("kubectl idc %v -o json is not valid JSON: %v\n%s", args, err, out)
	}
}

func mustContain(t *testing.T, what, out string, wants ...string) {
	t.Helper()
	norm := strings.Join(strings.Fields(out), " ")
	for _, w := range wants {
		if !strings.Contains(norm, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, out)
		}
	}
}

// kubectlPlugin drives the built plugin binary on the orders resource the
// jetstream step left Ready, with the two poison messages of its run in the
// dead letters (a message without an id, and one that is not JSON).
func (s *suite) kubectlPlugin(ctx context.Context, t *testing.T) {
	name := s.orders.Name

	// status on a Ready resource.
	out := s.pluginOK(ctx, t, "status", name)
	mustContain(t, "status", out, "IdempotentConsumer "+testNamespace+"/"+name, "Ready True", "Window: ", " decided", "Lag: ", "Last prune: ", "Pods (Deployment "+name+", 2/2 ready)")
	var st struct {
		Conditions []struct{ Type, Status string }       `json:"conditions"`
		Pods       []struct{ Name, Ready, Phase string } `json:"pods"`
		Window     struct {
			Window string `json:"window"`
		} `json:"window"`
	}
	s.pluginJSON(ctx, t, &st, "status", name)
	if len(st.Pods) != 2 || st.Pods[0].Ready != "1/1" || st.Pods[1].Ready != "1/1" || st.Window.Window == "" ||
		!slices.Contains(st.Conditions, struct{ Type, Status string }{"Ready", "True"}) {
		t.Fatalf("status -o json: %+v", st)
	}

	// deadletters lists the two poison messages, through a Job in the
	// restricted namespace that uses the resource's own Secret.
	out = s.pluginOK(ctx, t, "deadletters", name)
	mustContain(t, "deadletters", out, "2 of 2 dead letters of "+testNamespace+"/"+name, "poison-not-json", "invalid_json", "(none)", "missing_id")
	type deadLetter struct {
		MessageID   string `json:"messageId"`
		ReasonClass string `json:"reasonClass"`
		Attempts    int    `json:"attempts"`
	}
	var dl struct {
		Total       int          `json:"total"`
		DeadLetters []deadLetter `json:"deadLetters"`
	}
	s.pluginJSON(ctx, t, &dl, "deadletters", name)
	classes := map[string]deadLetter{}
	for _, d := range dl.DeadLetters {
		classes[d.ReasonClass] = d
	}
	if dl.Total != 2 || len(classes) != 2 || classes["invalid_json"].MessageID != "poison-not-json" || classes["missing_id"].MessageID != "" {
		t.Fatalf("deadletters -o json: %+v", dl)
	}
	s.pluginJSON(ctx, t, &dl, "deadletters", name, "--reason", "invalid_json")
	if dl.Total != 1 || dl.DeadLetters[0].MessageID != "poison-not-json" {
		t.Fatalf("deadletters --reason invalid_json: %+v", dl)
	}
	if res := s.plugin(ctx, t, "deadletters", name, "--reason", "poison"); res.code != 2 {
		t.Fatalf("an unknown reason class: exit %d, want 2 (usage)", res.code)
	}

	// redrive --dry-run counts what a redrive would select and changes
	// nothing.
	var dry struct {
		Token       string `json:"token"`
		DryRun      bool   `json:"dryRun"`
		WouldSelect *int64 `json:"wouldSelect"`
	}
	s.pluginJSON(ctx, t, &dry, "redrive", name, "--reason", "invalid_json", "--dry-run")
	if !dry.DryRun || dry.WouldSelect == nil || *dry.WouldSelect != 1 {
		t.Fatalf("redrive --dry-run: %+v, want 1 dead letter selected", dry)
	}
	if got := s.get(ctx, t, s.orders); got.Annotations[messagingv1alpha1.AnnotationRedrive] != "" {
		t.Fatalf("redrive --dry-run set the annotation: %v", got.Annotations)
	}

	// redrive --reason ... --wait settles each: the controller's Job
	// replays it through the claim and the effect, and the outcome is
	// printed (a poison message fails again, or has no usable id).
	for _, reason := range []string{"invalid_json", "missing_id"} {
		var rd struct {
			Token   string                              `json:"token"`
			Outcome *messagingv1alpha1.RedriveRunStatus `json:"outcome"`
		}
		s.pluginJSON(ctx, t, &rd, "redrive", name, "--reason", reason, "--wait")
		o := rd.Outcome
		if o == nil || o.Token != rd.Token || o.Phase != messagingv1alpha1.RedriveSucceeded || o.Selected != 1 || o.StillFailing+o.Unusable != 1 {
			t.Fatalf("redrive --reason %s --wait: %+v", reason, rd)
		}
		got := s.get(ctx, t, s.orders)
		if got.Annotations[messagingv1alpha1.AnnotationRedrive] != rd.Token || got.Annotations[messagingv1alpha1.AnnotationRedriveReason] != reason {
			t.Fatalf("annotations after redrive: %v", got.Annotations)
		}
	}
	out = s.pluginOK(ctx, t, "redrive", name, "--reason", "invalid_json", "--wait")
	mustContain(t, "redrive --wait", out, "Succeeded", "1 selected")
	s.pluginJSON(ctx, t, &dl, "deadletters", name, "--reason", "invalid_json")
	if dl.Total != 1 || dl.DeadLetters[0].Attempts < 3 {
		t.Fatalf("the not-JSON message was redriven twice and failed each time: attempts %+v, want >= 3", dl)
	}
	mustContain(t, "status after redrive", s.pluginOK(ctx, t, "status", name), "Last redrive: \"kubectl-idc-", "Succeeded")

	// explain-window names the input that decided, as status has it.
	ret := s.get(ctx, t, s.orders).Status.Retention
	rd, errD := time.ParseDuration(ret.RedeliveryHorizon)
	rp, errP := time.ParseDuration(ret.ReplayHorizon)
	if errD != nil || errP != nil {
		t.Fatalf("status.retention horizons %q, %q: %v %v", ret.RedeliveryHorizon, ret.ReplayHorizon, errD, errP)
	}
	deciding, sentence := []string{"R_replay"}, "R_replay decided"
	switch {
	case rd > rp:
		deciding, sentence = []string{"R_redeliver"}, "R_redeliver decided"
	case rd == rp:
		deciding, sentence = []string{"R_redeliver", "R_replay"}, "R_redeliver and R_replay tie at "+ret.ReplayHorizon
	}
	out = s.pluginOK(ctx, t, "explain-window", name)
	mustContain(t, "explain-window", out, "Window: "+ret.Window, sentence, "the broker (settings below)")
	var ex struct {
		Window string `json:"window"`
		Inputs []struct {
			Name     string `json:"name"`
			Deciding bool   `json:"deciding"`
		} `json:"inputs"`
	}
	s.pluginJSON(ctx, t, &ex, "explain-window", name)
	var decided []string
	for _, in := range ex.Inputs {
		if in.Deciding {
			decided = append(decided, in.Name)
		}
	}
	if ex.Window != ret.Window || !containsAll(decided, deciding) {
		t.Fatalf("explain-window -o json: window %s, deciding %v; want %s and %s", ex.Window, decided, ret.Window, deciding)
	}

	// No listing Job is left behind.
	jobs, err := s.c.KubectlCmd(ctx, "-n", testNamespace, "get", "jobs", "-l", "app.kubernetes.io/component=deadletters", "-o", "name")
	if err != nil || strings.TrimSpace(jobs) != "" {
		t.Fatalf("listing Jobs left: %q %v", jobs, err)
	}

	// The image carries the same plugin (exec runs it directly: no shell).
	inImage, err := s.c.KubectlCmd(ctx, "-n", localcluster.OperatorNamespace, "exec", "deployment/"+localcluster.ManagerDeployment, "--", "/kubectl-idc", "version", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ver struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal([]byte(inImage), &ver); err != nil || ver.Version != env.version {
		t.Fatalf("/kubectl-idc version in the image: %q (%v), want %s", inImage, err, env.version)
	}

	// kubectl finds it as a plugin on the PATH, and runs it.
	dir := t.TempDir()
	if err := os.Symlink(env.plugin, filepath.Join(dir, "kubectl-idc")); err != nil {
		t.Fatal(err)
	}
	path := dir + string(os.PathListSeparator) + os.Getenv("PATH")
	list := exec.CommandContext(ctx, env.kubectl, "plugin", "list")
	list.Env = append(os.Environ(), "PATH="+path)
	b, err := list.CombinedOutput()
	if err != nil || !strings.Contains(string(b), filepath.Join(dir, "kubectl-idc")) {
		t.Fatalf("kubectl plugin list does not show kubectl-idc on the PATH: %v\n%s", err, b)
	}
	viaKubectl := exec.CommandContext(ctx, env.kubectl, "idc", "status", name, "-n", testNamespace, "--kubeconfig", env.kubeconfig)
	viaKubectl.Env = list.Env
	b, err = viaKubectl.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl idc status: %v\n%s", err, b)
	}
	mustContain(t, "kubectl idc status", string(b), "IdempotentConsumer "+testNamespace+"/"+name, "Ready True")
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
