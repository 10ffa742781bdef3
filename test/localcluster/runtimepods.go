package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/idempotency-dev/idc-operator/test/podrunner"
)

// HealthAddrEnv is the variable through which the local pod runner gives
// each idc-runtime process its own /metrics, /healthz and /readyz address,
// so that several replicas can run on one machine. While idc-runtime does
// not read it, rewriteHealthAddr below does the same through the mounted
// config file.
const HealthAddrEnv = "IDC_HEALTH_ADDR"

// RunnerOptions are the pod runner's options for idc-runtime pods:
// "/idc-runtime" is runtimeBinary, and each pod's "metrics" port is its own.
func RunnerOptions(namespace, runtimeBinary, workDir string, log logr.Logger) podrunner.Options {
	return podrunner.Options{
		Namespace:   namespace,
		Commands:    map[string]string{"/idc-runtime": runtimeBinary},
		WorkDir:     workDir,
		PortEnv:     map[string]string{"metrics": HealthAddrEnv},
		RewriteFile: rewriteHealthAddr,
		Log:         log,
	}
}

// rewriteHealthAddr sets healthAddr in a mounted config.json to the pod's
// local "metrics" address. It is the stand-in for HealthAddrEnv until the
// runtime honours that variable; pods without the port (prune Jobs) keep the
// file as it is.
func rewriteHealthAddr(pod podrunner.PodInfo, containerPath string, content []byte) ([]byte, error) {
	addr := pod.Addr("metrics")
	if path.Base(containerPath) != "config.json" || addr == "" {
		return content, nil
	}
	var cfg map[string]any
	dec := json.NewDecoder(bytes.NewReader(content))
	dec.UseNumber()
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parsing the runtime config: %w", err)
	}
	cfg["healthAddr"] = addr
	return json.MarshalIndent(cfg, "", "  ")
}

// Metrics sums the idc_* samples (all label values of a name added up) over
// the /metrics endpoints of the given pods' "metrics" ports.
func Metrics(ctx context.Context, pods []podrunner.PodInfo) (map[string]float64, error) {
	out := map[string]float64{}
	for _, p := range pods {
		addr := p.Addr("metrics")
		if addr == "" {
			continue
		}
		if err := scrape(ctx, "http://"+addr+"/metrics", out); err != nil {
			return out, fmt.Errorf("scraping pod %s: %w", p.Name, err)
		}
	}
	return out, nil
}

func scrape(ctx context.Context, url string, into map[string]float64) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseSamples(resp.Body, "idc_", into)
}

// parseSamples adds the text-format samples whose name has prefix.
func parseSamples(r io.Reader, prefix string, into map[string]float64) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if j := strings.LastIndex(rest, "}"); j >= 0 {
			rest = rest[j+1:]
		}
		fields := strings.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		into[name] += v
	}
	return sc.Err()
}
