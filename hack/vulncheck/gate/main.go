// Command gate reads govulncheck's JSON stream (-format json) on stdin and
// fails when a vulnerability is called (a finding whose trace reaches a
// function) and is not in the allow-list. Imported-but-not-called findings are
// counted, not failed: no code path reaches them.
//
// The allow-list has one entry a line: the OSV id, then the reason it is
// allowed (required). Lines starting with # and blank lines are ignored.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type frame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
	Receiver string `json:"receiver"`
}

type finding struct {
	OSV          string  `json:"osv"`
	FixedVersion string  `json:"fixed_version"`
	Trace        []frame `json:"trace"`
}

type message struct {
	Finding *finding `json:"finding"`
}

// called is one vulnerability reached from the scanned code, with the first
// trace that shows it.
type called struct {
	id, module, version, fixed, via string
}

func main() {
	allowPath := flag.String("allow", "", "allow-list file (OSV id, then the reason)")
	target := flag.String("target", "", "what was scanned, for the report")
	flag.Parse()
	allowed, err := readAllowList(*allowPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	found, imported, err := readFindings(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Exit(report(os.Stdout, *target, found, imported, allowed))
}

func readAllowList(path string) (map[string]string, error) {
	allowed := map[string]string{}
	if path == "" {
		return allowed, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("while opening the allow-list: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, reason, _ := strings.Cut(line, " ")
		if strings.TrimSpace(reason) == "" {
			return nil, fmt.Errorf("%s:%d: %s has no reason: every allowed vulnerability says why", path, n, id)
		}
		allowed[id] = strings.TrimSpace(reason)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("while reading the allow-list: %w", err)
	}
	return allowed, nil
}

// readFindings returns the called vulnerabilities by id and the ids of those
// only imported or required.
func readFindings(r io.Reader) (map[string]called, map[string]bool, error) {
	found := map[string]called{}
	imported := map[string]bool{}
	dec := json.NewDecoder(r)
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return found, imported, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("while reading govulncheck's JSON: %w", err)
		}
		if m.Finding == nil || len(m.Finding.Trace) == 0 {
			continue
		}
		f := m.Finding
		if f.Trace[0].Function == "" {
			imported[f.OSV] = true
			continue
		}
		if _, ok := found[f.OSV]; ok {
			continue
		}
		top, last := f.Trace[0], f.Trace[len(f.Trace)-1]
		found[f.OSV] = called{id: f.OSV, module: top.Module, version: top.Version, fixed: f.FixedVersion,
			via: fmt.Sprintf("%s.%s <- %s.%s", top.Package, symbol(top), last.Package, symbol(last))}
	}
}

func symbol(f frame) string {
	if f.Receiver != "" {
		return strings.TrimPrefix(f.Receiver, "*") + "." + f.Function
	}
	return f.Function
}

// report prints one line per called vulnerability and a summary; it returns
// the exit code: 1 when a called vulnerability is not allowed.
func report(w io.Writer, target string, found map[string]called, imported map[string]bool, allowed map[string]string) int {
	ids := make([]string, 0, len(found))
	for id := range found {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	failed := 0
	for _, id := range ids {
		c := found[id]
		if reason, ok := allowed[id]; ok {
			fmt.Fprintf(w, "ALLOWED %s %s@%s (fixed in %s) via %s: %s\n", id, c.module, c.version, c.fixed, c.via, reason)
			continue
		}
		failed++
		fmt.Fprintf(w, "CALLED  %s %s@%s (fixed in %s) via %s\n", id, c.module, c.version, c.fixed, c.via)
	}
	for id := range imported {
		if _, ok := found[id]; ok {
			delete(imported, id)
		}
	}
	fmt.Fprintf(w, "vulncheck %s: %d called (%d allowed, %d not allowed), %d imported or required but not called\n",
		target, len(found), len(found)-failed, failed, len(imported))
	if failed > 0 {
		return 1
	}
	return 0
}
