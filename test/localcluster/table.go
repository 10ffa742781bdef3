package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// tableAccept asks the API server for its Table rendering, the one kubectl
// get prints.
const tableAccept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"

// Table returns the API server's Table of a namespaced resource list: the
// printer columns kubectl get shows.
func Table(ctx context.Context, cfg *rest.Config, gvr schema.GroupVersionResource, namespace string) (*metav1.Table, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the HTTP client: %w", err)
	}
	u := fmt.Sprintf("%s/apis/%s/%s/namespaces/%s/%s?includeObject=None",
		strings.TrimSuffix(cfg.Host, "/"), gvr.Group, gvr.Version, namespace, gvr.Resource)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", tableAccept)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", u, resp.Status, body)
	}
	var t metav1.Table
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, fmt.Errorf("decoding the Table: %w", err)
	}
	return &t, nil
}

// RenderTable prints a Table as kubectl does: upper-case headers, columns
// of priority 0 only unless wide, <none> for empty cells.
func RenderTable(t *metav1.Table, wide bool) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	var cols []int
	var headers []string
	for i, c := range t.ColumnDefinitions {
		if c.Priority > 0 && !wide {
			continue
		}
		cols = append(cols, i)
		headers = append(headers, strings.ToUpper(c.Name))
	}
	_, _ = fmt.Fprintln(w, strings.Join(headers, "\t"))
	for _, row := range t.Rows {
		cells := make([]string, 0, len(cols))
		for _, i := range cols {
			cells = append(cells, cellText(row.Cells, i))
		}
		_, _ = fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	_ = w.Flush()
	return b.String()
}

func cellText(cells []any, i int) string {
	if i >= len(cells) || cells[i] == nil {
		return "<none>"
	}
	s := fmt.Sprint(cells[i])
	if s == "" {
		return "<none>"
	}
	return s
}
