package bench

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// commitListener records when each claim transaction's NOTIFY arrived.
type commitListener struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	at     map[int64]time.Time
	err    error
}

// listenCommits adds the notifying trigger to table (the schema's inbox,
// or the floor consumer's table) and starts listening.
func (t *throughputEnv) listenCommits(b *testing.B, schema, table string) *commitListener {
	b.Helper()
	ctx := context.Background()
	channel := "idc_lat_" + schema
	for _, q := range []string{
		`CREATE FUNCTION ` + schema + `.notify_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_notify('` + channel + `', (txid_current() % 4294967296)::text); RETURN NULL; END $$`,
		`CREATE TRIGGER notify_commit AFTER INSERT ON ` + table + ` FOR EACH STATEMENT EXECUTE FUNCTION ` + schema + `.notify_commit()`,
	} {
		if _, err := t.pool.Exec(ctx, q); err != nil {
			b.Fatalf("running %q: %v", q, err)
		}
	}
	conn, err := pgx.Connect(ctx, t.dsn)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		b.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	l := &commitListener{conn: conn, cancel: cancel, done: make(chan struct{}), at: map[int64]time.Time{}}
	go func() {
		defer close(l.done)
		for {
			n, err := conn.WaitForNotification(lctx)
			now := time.Now()
			if err != nil {
				if lctx.Err() == nil {
					l.mu.Lock()
					l.err = err
					l.mu.Unlock()
				}
				return
			}
			xid, err := strconv.ParseInt(n.Payload, 10, 64)
			if err != nil {
				continue
			}
			l.mu.Lock()
			l.at[xid] = now
			l.mu.Unlock()
		}
	}()
	return l
}

// stop ends the listener once the notifications stopped coming (the last
// commits' may still be on their way) and returns them.
func (l *commitListener) stop(b *testing.B, _ int) map[int64]time.Time {
	b.Helper()
	size := -1
	for {
		time.Sleep(100 * time.Millisecond)
		l.mu.Lock()
		n := len(l.at)
		l.mu.Unlock()
		if n == size {
			break
		}
		size = n
	}
	l.cancel()
	<-l.done
	_ = l.conn.Close(context.Background())
	if l.err != nil {
		b.Fatalf("listening for commits: %v", l.err)
	}
	return l.at
}
