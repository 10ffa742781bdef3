package consumer

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// isConnectionError reports whether err means the database (or the path to
// it) is unavailable rather than that this batch is bad. Such failures never
// count toward a message's attempts: the loop waits for the database instead
// of dead-lettering healthy messages.
func isConnectionError(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return isUnavailableSQLState(pgErr.Code)
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case errors.As(err, &netErr), errors.As(err, &connectErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, pgconn.ErrConnClosed),
		pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	// Some teardown paths only say so in text (a connection killed while a
	// result was being read).
	msg := err.Error()
	return strings.Contains(msg, "conn closed") || strings.Contains(msg, "connection reset") ||
		strings.Contains(msg, "broken pipe")
}

// isUnavailableSQLState: connection exceptions (08), operator intervention
// (57P01 admin shutdown / pg_terminate_backend, 57P02 crash shutdown, 57P03
// cannot connect now), insufficient resources (53: disk full, out of
// memory, too many connections) and transaction rollbacks caused by other
// transactions (40001 serialization failure, 40P01 deadlock): none says
// anything about the messages, so none may count toward dead-lettering.
func isUnavailableSQLState(code string) bool {
	return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "53") ||
		code == "57P01" || code == "57P02" || code == "57P03" ||
		code == "40001" || code == "40P01"
}

// backoff returns the wait before retry number n (1-based): exponential from
// initial, capped at max, with jitter over the upper half so replicas that
// failed together do not retry together.
func backoff(n int, initial, maxWait time.Duration) time.Duration {
	d := initial
	for i := 1; i < n && d < maxWait; i++ {
		d *= 2
	}
	d = min(d, maxWait)
	half := d / 2
	return half + rand.N(half+1)
}
