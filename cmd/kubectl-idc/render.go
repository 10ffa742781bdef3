package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// printer writes text and keeps the first error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) table() *tabwriter.Writer { return tabwriter.NewWriter(p.w, 0, 4, 2, ' ', 0) }

func (p *printer) tf(tw *tabwriter.Writer, format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(tw, format, args...)
	}
}

func (p *printer) flush(tw *tabwriter.Writer) {
	if p.err == nil {
		p.err = tw.Flush()
	}
}

// excerpt cuts s to n runes on one line, marking the cut.
func excerpt(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// age writes how long ago t was, like kubectl (5s, 3m, 2h, 4d).
func age(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
