package bench

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// --- helpers ---

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// scrapeClient reads the replicas' counters every pollEvery without gzip:
// compressing 100 scrapes a second would cost the replicas CPU the rows
// are meant to measure.
var scrapeClient = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableCompression: true}}

// scrapeCounter reads one unlabelled counter from a /metrics page; 0 when
// the page is not up yet.
func scrapeCounter(url, name string) int { return int(scrapeFloat(url, name)) }

// scrapeFloat reads one sample (its name with any labels, as exposed); 0
// when the page is not up yet.
func scrapeFloat(url, name string) float64 { return scrapeFloats(url, name)[0] }

// scrapeFloats reads several samples from one scrape, so that they are
// consistent with each other (a histogram's count and a bucket read in two
// scrapes can disagree by the observations made in between).
// sinkKind matches the sink_kind label the runtime puts on every idc_
// series; the floor consumer's lines have none.
var sinkKind = regexp.MustCompile(`,sink_kind="[^"]*"|sink_kind="[^"]*",?`)

// withoutSinkKind is a sample line without its sink_kind label, so one name
// matches the runtime's and the floor consumer's lines.
func withoutSinkKind(line string) string {
	if !strings.Contains(line, "sink_kind=") {
		return line
	}
	return strings.Replace(sinkKind.ReplaceAllString(line, ""), "{}", "", 1)
}

func scrapeFloats(url string, names ...string) []float64 {
	out := make([]float64, len(names))
	resp, err := scrapeClient.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := withoutSinkKind(sc.Text())
		for i, name := range names {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
					out[i] = f
				}
			}
		}
	}
	return out
}

// vmHWM is a process's peak resident set size in MiB, from /proc.
func vmHWM(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				kb, _ := strconv.ParseFloat(fields[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}
