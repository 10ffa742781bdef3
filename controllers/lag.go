package controllers

// lagBucket is the power-of-ten bucket of a backlog: 0 for none, then
// 1 for 1-9, 2 for 10-99, 3 for 100-999, and so on.
func lagBucket(n int64) int {
	if n <= 0 {
		return 0
	}
	b := 1
	for ; n >= 10; n /= 10 {
		b++
	}
	return b
}

// statusLag is what status.lag becomes after a read: the read backlog when
// it falls in another bucket than the one status.lag shows (or none is
// shown), else status.lag unchanged. A backlog that moves while traffic
// flows (every read, in a busy consumer) does not rewrite status, which
// GitOps tools diff and the API server stores; one that drains to 0, or
// grows tenfold, does.
func statusLag(current, read *int64) *int64 {
	if read == nil {
		return current
	}
	if current != nil && lagBucket(*current) == lagBucket(*read) {
		return current
	}
	v := *read
	return &v
}

// observeLag records a read backlog in the metric and, by bucket, in status.
func observeLag(s *scope, read *int64) {
	if read == nil {
		return
	}
	resourceLag.WithLabelValues(s.key.Namespace, s.key.Name).Set(float64(*read))
	s.idc.Status.Lag = statusLag(s.idc.Status.Lag, read)
}
