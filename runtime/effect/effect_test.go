package effect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempotency-dev/idc-operator/internal/pgtest"
	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/extract"
	"github.com/idempotency-dev/idc-operator/runtime/source"
)

func rec(id, body string) *Record {
	m := extract.NewMessage(source.Message{
		NativeID: "n-" + id, Body: []byte(body), Headers: map[string]string{"Trace": "t-" + id},
		PublishedAt: time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC),
	})
	m.ID = id
	return m
}

func apply(t *testing.T, pool *pgxpool.Pool, e Effect, recs []*Record) Result {
	t.Helper()
	ctx := context.Background()
	var res Result
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = e.Apply(ctx, tx, recs)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func upsertConfig(seqCol string) config.Effect {
	return config.Effect{Upsert: &config.Upsert{
		Table: "orders", Key: []string{"order_id"}, SequenceColumn: seqCol,
		Columns: map[string]string{"order_id": "$.orderId", "status": "$.status", "version": "$.version"},
	}}
}

const ordersDDL = `CREATE TABLE s.orders (order_id text PRIMARY KEY, status text NOT NULL, version bigint NOT NULL)`

// Shuffled versions, some delivered twice, across batches: every key ends at
// its highest version, and Applied/Stale match a model of the gate.
func TestUpsertSequenceGate(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA s", ordersDDL)
	e, err := New(upsertConfig("version"), "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	type delivery struct {
		key string
		ver int
	}
	var all []delivery
	for k := range 20 {
		for v := 1; v <= 10; v++ {
			all = append(all, delivery{fmt.Sprintf("o%d", k), v})
			if rand.IntN(4) == 0 {
				all = append(all, delivery{fmt.Sprintf("o%d", k), v})
			}
		}
	}
	rand.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	stored := map[string]int{}
	var wantApplied, gotApplied, gotStale int
	for start := 0; start < len(all); start += 17 {
		batch := all[start:min(start+17, len(all))]
		recs := make([]*Record, len(batch))
		best := map[string]int{}
		for i, d := range batch {
			recs[i] = rec(fmt.Sprintf("m%d", start+i), fmt.Sprintf(`{"orderId":%q,"status":"v%d","version":%d}`, d.key, d.ver, d.ver))
			best[d.key] = max(best[d.key], d.ver)
		}
		for k, v := range best {
			if v > stored[k] {
				stored[k] = v
				wantApplied++
			}
		}
		res := apply(t, pool, e, recs)
		if len(res.Failed) != 0 {
			t.Fatalf("unexpected failures: %+v", res.Failed)
		}
		gotApplied += res.Applied
		gotStale += res.Stale
	}
	if gotApplied != wantApplied || gotStale != len(all)-wantApplied {
		t.Errorf("applied %d stale %d; want applied %d stale %d", gotApplied, gotStale, wantApplied, len(all)-wantApplied)
	}
	rows, err := pool.Query(context.Background(), "SELECT order_id, status, version FROM s.orders")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var id, status string
		var v int
		if err := rows.Scan(&id, &status, &v); err != nil {
			t.Fatal(err)
		}
		n++
		if v != 10 || status != "v10" {
			t.Errorf("%s ended at version %d status %s, want 10/v10", id, v, status)
		}
	}
	if rows.Err() != nil || n != 20 {
		t.Fatalf("%d rows (%v), want 20", n, rows.Err())
	}
}

func TestUpsertPerRecordFailuresAndLastWriterWins(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA s", ordersDDL)
	gated, err := New(upsertConfig("version"), "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	res := apply(t, pool, gated, []*Record{
		rec("a", `{"orderId":"A","status":"ok","version":1}`),
		rec("b", `{"orderId":"B","version":1}`),                    // missing status
		rec("c", `{"orderId":"C","status":"x","version":"seven"}`), // sequence not an integer
		rec("d", `{"orderId":"D","status":"ok","version":2}`),
	})
	if res.Applied != 2 || len(res.Failed) != 2 {
		t.Fatalf("result %+v, want 2 applied and 2 failed", res)
	}
	if res.Failed[0].Index != 1 || !errors.Is(res.Failed[0].Err, extract.ErrMissing) || res.Failed[0].Retryable {
		t.Errorf("failure 0 = %+v, want index 1 ErrMissing", res.Failed[0])
	}
	if res.Failed[1].Index != 2 || !errors.Is(res.Failed[1].Err, extract.ErrNotInteger) {
		t.Errorf("failure 1 = %+v, want index 2 ErrNotInteger", res.Failed[1])
	}
	// Without a sequence column the last record of a key in the batch wins.
	lww, err := New(upsertConfig(""), "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	res = apply(t, pool, lww, []*Record{
		rec("e", `{"orderId":"A","status":"second","version":9}`),
		rec("f", `{"orderId":"A","status":"third","version":0}`),
	})
	var status string
	if err := pool.QueryRow(context.Background(), "SELECT status FROM s.orders WHERE order_id = 'A'").Scan(&status); err != nil || status != "third" {
		t.Fatalf("status = %q, %v; want third", status, err)
	}
	if res.Applied != 1 || res.Stale != 1 {
		t.Errorf("result %+v, want 1 applied 1 stale", res)
	}
}

func TestAppend(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA s", `CREATE TABLE s.events (id bigserial, message_id text, amount numeric,
		at timestamptz, trace text, doc jsonb, tags text)`)
	e, err := New(config.Effect{Append: &config.Append{Table: "events", Columns: map[string]string{
		"message_id": "@messageId", "amount": "$.amount", "at": "@publishedAt", "trace": "@header:Trace",
		"doc": "@payload", "tags": "$.tags",
	}}}, "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	res := apply(t, pool, e, []*Record{
		rec("m1", `{"amount":12.345678901234567890123,"tags":["a","b"]}`),
		rec("m2", `{"amount":null,"tags":"x"}`),
		rec("m3", `{"tags":"x"}`), // missing amount
		rec("m4", `{"amount":1,"tags":"it's ; DROP TABLE s.events; --"}`),
	})
	if res.Applied != 3 || len(res.Failed) != 1 || res.Failed[0].Index != 2 {
		t.Fatalf("result %+v, want 3 applied and m3 failed", res)
	}
	var amount, trace, tags, doc string
	var at time.Time
	err = pool.QueryRow(context.Background(), `SELECT amount::text, at, trace, tags, doc::text FROM s.events WHERE message_id = 'm1'`).
		Scan(&amount, &at, &trace, &tags, &doc)
	if err != nil {
		t.Fatal(err)
	}
	if amount != "12.345678901234567890123" || !at.Equal(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)) ||
		trace != "t-m1" || tags != `["a", "b"]` || !strings.Contains(doc, `"tags": ["a", "b"]`) {
		t.Errorf("row = %s %s %s %s %s", amount, at, trace, tags, doc)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM s.events WHERE tags LIKE 'it''s ; DROP%'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("value with SQL in it stored %d times (%v), want 1", n, err)
	}
}

func TestConvertNamedParams(t *testing.T) {
	for _, tc := range []struct {
		in, out string
		names   []string
	}{
		{"UPDATE a SET b = :b WHERE id = :id AND c = :b", "UPDATE a SET b = $1 WHERE id = $2 AND c = $1", []string{"b", "id"}},
		{"SELECT :n::int, x::text", "SELECT $1::int, x::text", []string{"n"}},
		{"SELECT ':x', 'it''s :y', E'\\' :z', :w", "SELECT ':x', 'it''s :y', E'\\' :z', $1", []string{"w"}},
		{`SELECT ":col" FROM t -- :c1` + "\n" + `WHERE /* :c2 /* :c3 */ */ a = :a`, `SELECT ":col" FROM t -- :c1` + "\n" + `WHERE /* :c2 /* :c3 */ */ a = $1`, []string{"a"}},
		{"SELECT $$ :q $$, $t$ :r $t$, :s", "SELECT $$ :q $$, $t$ :r $t$, $1", []string{"s"}},
		{"SELECT arr[1:2]", "SELECT arr[1:2]", nil},
	} {
		out, names, err := ConvertNamedParams(tc.in)
		if err != nil || out != tc.out || strings.Join(names, ",") != strings.Join(tc.names, ",") {
			t.Errorf("ConvertNamedParams(%q) = %q %v %v; want %q %v", tc.in, out, names, err, tc.out, tc.names)
		}
	}
	for _, bad := range []string{"SELECT $1", "SELECT 'open", "SELECT /* open", "SELECT $a$ open"} {
		if _, _, err := ConvertNamedParams(bad); err == nil {
			t.Errorf("ConvertNamedParams(%q) succeeded, want an error", bad)
		}
	}
}

func TestSQLEffect(t *testing.T) {
	pool, _ := pgtest.NewPool(t)
	pgtest.Exec(t, pool, "CREATE SCHEMA s", "CREATE TABLE s.accounts (id text PRIMARY KEY, balance int NOT NULL, note text)",
		"INSERT INTO s.accounts VALUES ('acc1', 100, NULL), ('acc2', 0, NULL)")
	stmt := `UPDATE s.accounts SET balance = balance + :amount::int, -- adds :amount
		note = ':x is not a param, ' || :note WHERE id = :id`
	if _, err := New(config.Effect{SQL: &config.SQL{Statement: stmt, Params: map[string]string{"amount": "$.amount", "id": "$.account"}}}, "s", nil); err == nil {
		t.Fatal("a statement using an undeclared :note must be refused at New")
	}
	e, err := New(config.Effect{SQL: &config.SQL{Statement: stmt, Params: map[string]string{
		"amount": "$.amount", "id": "$.account", "note": "@messageId",
	}}}, "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	res := apply(t, pool, e, []*Record{
		rec("m1", `{"account":"acc1","amount":5}`),
		rec("m2", `{"account":"acc1","amount":"7"}`),
		rec("m3", `{"account":"acc2"}`),
		rec("m4", `{"account":"acc2","amount":-3}`),
	})
	if res.Applied != 3 || len(res.Failed) != 1 || res.Failed[0].Index != 2 {
		t.Fatalf("result %+v, want 3 applied and m3 failed", res)
	}
	for id, want := range map[string]string{"acc1": "112 :x is not a param, m2", "acc2": "-3 :x is not a param, m4"} {
		var got string
		if err := pool.QueryRow(context.Background(), "SELECT balance || ' ' || note FROM s.accounts WHERE id = $1", id).Scan(&got); err != nil || got != want {
			t.Errorf("%s = %q, %v; want %q", id, got, err, want)
		}
	}
	// A statement error fails the whole batch.
	ctx := context.Background()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := e.Apply(ctx, tx, []*Record{rec("m5", `{"account":"acc1","amount":"abc"}`)})
		return err
	})
	if err == nil {
		t.Fatal("an amount that is not an int must fail the batch")
	}
}

func TestHTTPEffect(t *testing.T) {
	var mu sync.Mutex
	keys := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Status int }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		keys[r.Header.Get(IdempotencyKeyHeader)] = r.Method + " " + r.Header.Get("Content-Type")
		mu.Unlock()
		if body.Status == 0 {
			time.Sleep(300 * time.Millisecond)
		}
		w.WriteHeader(body.Status)
		fmt.Fprint(w, "why")
	}))
	defer srv.Close()
	e, err := New(config.Effect{HTTP: &config.HTTP{URL: srv.URL, Method: "PUT", Timeout: config.Duration{Duration: 100 * time.Millisecond}}}, "s", nil)
	if err != nil {
		t.Fatal(err)
	}
	if e.Transactional() {
		t.Fatal("http must not be transactional")
	}
	cases := []struct {
		status    int
		ok        bool
		retryable bool
	}{{200, true, false}, {204, true, false}, {400, false, false}, {404, false, false}, {409, false, false},
		{408, false, true}, {429, false, true}, {500, false, true}, {503, false, true}, {0, false, true}}
	outages := map[int]bool{429: true, 503: true, 0: true}
	recs := make([]*Record, len(cases))
	for i, c := range cases {
		recs[i] = rec(fmt.Sprintf("key-%d", i), fmt.Sprintf(`{"status":%d}`, c.status))
	}
	res, err := e.Apply(context.Background(), nil, recs)
	if err != nil {
		t.Fatal(err)
	}
	failed := map[int]Failure{}
	for _, f := range res.Failed {
		failed[f.Index] = f
	}
	for i, c := range cases {
		f, isFailed := failed[i]
		if isFailed == c.ok || (isFailed && f.Retryable != c.retryable) {
			t.Errorf("status %d: failure %+v, want ok=%v retryable=%v", c.status, f, c.ok, c.retryable)
		}
		if isFailed && f.Outage != outages[c.status] {
			t.Errorf("status %d: outage = %v, want %v", c.status, f.Outage, outages[c.status])
		}
		if isFailed && c.status != 0 && !strings.Contains(f.Err.Error(), fmt.Sprintf("status %d", c.status)) {
			t.Errorf("status %d: reason %q does not name the status", c.status, f.Err)
		}
		if got := keys[fmt.Sprintf("key-%d", i)]; got != "PUT application/json" {
			t.Errorf("call %d arrived as %q, want a PUT with the Idempotency-Key and a JSON body", i, got)
		}
	}
	if res.Applied != 2 {
		t.Errorf("applied %d, want 2", res.Applied)
	}
	res, _ = e.Apply(context.Background(), nil, []*Record{rec("bad", `{not json`)})
	if len(res.Failed) != 1 || res.Failed[0].Retryable || !errors.Is(res.Failed[0].Err, extract.ErrInvalidJSON) {
		t.Errorf("invalid JSON payload: %+v, want a permanent failure", res)
	}
}
