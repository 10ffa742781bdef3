package podrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// execSpec is what one container start runs.
type execSpec struct {
	path string
	args []string
	env  []string // KEY=value, in the container's order
	dir  string
}

// mount maps a container mountPath to the local directory (or file, with
// subPath) standing in for it.
type mount struct {
	containerPath string
	localPath     string
}

// objectReader is the part of the client resolution needs.
type objectReader interface {
	Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error
}

// resolver turns one pod's container into an execSpec. It reads Secrets and
// ConfigMaps at every start, as a kubelet does.
type resolver struct {
	reader    objectReader
	namespace string
	commands  map[string]string
	rewrite   RewriteFunc
	portEnv   map[string]string
}

// resolve materialises the volumes under podDir and builds the command.
func (r *resolver) resolve(ctx context.Context, p *podIdentity, podDir string) (*execSpec, error) {
	spec := &p.spec
	if len(spec.InitContainers) > 0 {
		return nil, errors.New("init containers are not supported by the local pod runner")
	}
	if len(spec.Containers) != 1 {
		return nil, fmt.Errorf("the local pod runner runs pods of exactly one container, this one has %d", len(spec.Containers))
	}
	c := &spec.Containers[0]
	if len(c.Command) == 0 {
		return nil, fmt.Errorf("container %s has no command: the image entrypoint is unknown to the local pod runner", c.Name)
	}
	binary, ok := r.commands[c.Command[0]]
	if !ok {
		return nil, fmt.Errorf("container %s: no local executable for command %q (Options.Commands)", c.Name, c.Command[0])
	}
	mounts, err := r.materialise(ctx, p, c, podDir)
	if err != nil {
		return nil, err
	}
	env, err := r.environment(ctx, p, c)
	if err != nil {
		return nil, err
	}
	vars := envMap(env)
	out := &execSpec{path: binary, dir: podDir}
	for _, a := range append(append([]string{}, c.Command[1:]...), c.Args...) {
		out.args = append(out.args, rewriteArg(expand(a, vars), mounts))
	}
	for _, kv := range env {
		out.env = append(out.env, kv.name+"="+rewritePath(kv.value, mounts))
	}
	if c.WorkingDir != "" {
		if local := rewritePath(c.WorkingDir, mounts); local != c.WorkingDir {
			out.dir = local
		}
	}
	return out, nil
}

// envVar is one resolved variable.
type envVar struct{ name, value string }

func envMap(env []envVar) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		m[kv.name] = kv.value
	}
	return m
}

// environment resolves envFrom, then env (later entries win, as in a
// kubelet), then the runner's port variables unless the pod sets them.
func (r *resolver) environment(ctx context.Context, p *podIdentity, c *corev1.Container) ([]envVar, error) {
	var env []envVar
	set := func(name, value string) {
		for i := range env {
			if env[i].name == name {
				env[i].value = value
				return
			}
		}
		env = append(env, envVar{name, value})
	}
	for _, from := range c.EnvFrom {
		data, err := r.envFromData(ctx, from)
		if err != nil {
			return nil, err
		}
		for _, k := range sortedKeys(data) {
			set(from.Prefix+k, data[k])
		}
	}
	for _, e := range c.Env {
		value, skip, err := r.envValue(ctx, p, e, envMap(env))
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if !skip {
			set(e.Name, value)
		}
	}
	defined := envMap(env)
	for _, port := range c.Ports {
		name := r.portEnv[port.Name]
		if _, ok := defined[name]; name == "" || ok {
			continue
		}
		set(name, "127.0.0.1:"+strconv.Itoa(p.ports[port.Name]))
	}
	return env, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (r *resolver) envFromData(ctx context.Context, from corev1.EnvFromSource) (map[string]string, error) {
	switch {
	case from.SecretRef != nil:
		s, err := r.secret(ctx, from.SecretRef.Name, optional(from.SecretRef.Optional))
		if s == nil || err != nil {
			return nil, err
		}
		out := map[string]string{}
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	case from.ConfigMapRef != nil:
		cm, err := r.configMap(ctx, from.ConfigMapRef.Name, optional(from.ConfigMapRef.Optional))
		if cm == nil || err != nil {
			return nil, err
		}
		return cm.Data, nil
	}
	return nil, nil
}

func optional(b *bool) bool { return b != nil && *b }

// envValue resolves one env entry; skip is true for an optional reference
// whose object or key is missing.
func (r *resolver) envValue(ctx context.Context, p *podIdentity, e corev1.EnvVar, defined map[string]string) (value string, skip bool, err error) {
	from := e.ValueFrom
	switch {
	case from == nil:
		return expand(e.Value, defined), false, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := r.secret(ctx, ref.Name, optional(ref.Optional))
		if s == nil || err != nil {
			return "", true, err
		}
		v, ok := s.Data[ref.Key]
		if !ok && !optional(ref.Optional) {
			return "", false, fmt.Errorf("key %q is missing from Secret %s", ref.Key, ref.Name)
		}
		return string(v), !ok, nil
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := r.configMap(ctx, ref.Name, optional(ref.Optional))
		if cm == nil || err != nil {
			return "", true, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok && !optional(ref.Optional) {
			return "", false, fmt.Errorf("key %q is missing from ConfigMap %s", ref.Key, ref.Name)
		}
		return v, !ok, nil
	case from.FieldRef != nil:
		v, err := p.field(from.FieldRef.FieldPath)
		return v, false, err
	}
	return "", false, errors.New("only secretKeyRef, configMapKeyRef and fieldRef are supported")
}

// secret returns nil without error for a missing optional Secret.
func (r *resolver) secret(ctx context.Context, name string, opt bool) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	err := r.reader.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: name}, s)
	if apierrors.IsNotFound(err) && opt {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s: %w", name, err)
	}
	return s, nil
}

func (r *resolver) configMap(ctx context.Context, name string, opt bool) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{}
	err := r.reader.Get(ctx, client.ObjectKey{Namespace: r.namespace, Name: name}, cm)
	if apierrors.IsNotFound(err) && opt {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s: %w", name, err)
	}
	return cm, nil
}

// field answers a downward-API fieldRef.
func (p *podIdentity) field(path string) (string, error) {
	switch path {
	case "metadata.name":
		return p.name, nil
	case "metadata.namespace":
		return p.namespace, nil
	case "metadata.uid":
		return p.uid, nil
	case "spec.nodeName":
		return "localhost", nil
	case "spec.serviceAccountName":
		return p.spec.ServiceAccountName, nil
	case "status.podIP", "status.hostIP":
		return "127.0.0.1", nil
	}
	if key, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return p.labels[strings.TrimSuffix(key, "']")], nil
	}
	if key, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return p.annotations[strings.TrimSuffix(key, "']")], nil
	}
	return "", fmt.Errorf("fieldRef %s is not supported by the local pod runner", path)
}

// materialise writes the container's volumes under podDir/volumes and
// returns the mounts, longest container path first.
func (r *resolver) materialise(ctx context.Context, p *podIdentity, c *corev1.Container, podDir string) ([]mount, error) {
	volumes := map[string]corev1.Volume{}
	for _, v := range p.spec.Volumes {
		volumes[v.Name] = v
	}
	var mounts []mount
	for _, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %s names no volume", vm.Name)
		}
		dir := filepath.Join(podDir, "volumes", v.Name)
		if err := r.writeVolume(ctx, p, v, vm.MountPath, dir); err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
		mounts = append(mounts, mount{containerPath: filepath.Clean(vm.MountPath), localPath: filepath.Join(dir, vm.SubPath)})
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].containerPath) > len(mounts[j].containerPath) })
	return mounts, nil
}

func (r *resolver) writeVolume(ctx context.Context, p *podIdentity, v corev1.Volume, mountPath, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	switch {
	case v.EmptyDir != nil:
		return nil
	case v.ConfigMap != nil:
		cm, err := r.configMap(ctx, v.ConfigMap.Name, optional(v.ConfigMap.Optional))
		if cm == nil || err != nil {
			return err
		}
		data := map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			data[k] = b
		}
		return r.writeFiles(p, mountPath, dir, data, v.ConfigMap.Items)
	case v.Secret != nil:
		s, err := r.secret(ctx, v.Secret.SecretName, optional(v.Secret.Optional))
		if s == nil || err != nil {
			return err
		}
		return r.writeFiles(p, mountPath, dir, s.Data, v.Secret.Items)
	}
	return errors.New("only configMap, secret and emptyDir volumes are supported by the local pod runner")
}

// writeFiles writes the keys (or the items' paths) into dir, through the
// rewrite hook.
func (r *resolver) writeFiles(p *podIdentity, mountPath, dir string, data map[string][]byte, items []corev1.KeyToPath) error {
	paths := map[string]string{}
	for k := range data {
		paths[k] = k
	}
	if len(items) > 0 {
		paths = map[string]string{}
		for _, it := range items {
			paths[it.Key] = it.Path
		}
	}
	for key, rel := range paths {
		content, ok := data[key]
		if !ok {
			return fmt.Errorf("key %q is not in the referenced object", key)
		}
		if r.rewrite != nil {
			var err error
			if content, err = r.rewrite(p.info(), filepath.Join(mountPath, rel), content); err != nil {
				return fmt.Errorf("rewriting %s: %w", rel, err)
			}
		}
		file := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(file, content, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rewritePath maps a container path under a mount to the local path.
func rewritePath(s string, mounts []mount) string {
	for _, m := range mounts {
		if s == m.containerPath {
			return m.localPath
		}
		if rest, ok := strings.CutPrefix(s, m.containerPath+"/"); ok {
			return filepath.Join(m.localPath, rest)
		}
	}
	return s
}

// rewriteArg also handles the --flag=/path form.
func rewriteArg(a string, mounts []mount) string {
	if flag, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(flag, "-") {
		return flag + "=" + rewritePath(value, mounts)
	}
	return rewritePath(a, mounts)
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand applies Kubernetes' $(VAR) expansion: defined variables are
// replaced, undefined references kept, $$ escapes a dollar.
func expand(s string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := vars[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}
