package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idempotency-dev/idc-operator/runtime/config"
	"github.com/idempotency-dev/idc-operator/runtime/inbox"
	"github.com/idempotency-dev/idc-operator/runtime/sink"
)

// ErrClaimRace: under ClaimCount, another transaction claimed one of the
// batch's ids between the read and the insert. Transient
// (sink.ClassUnavailable): the batch is retried, nothing is dead-lettered.
var ErrClaimRace = errors.New("a concurrent claim of the same ids changed the inbox during the claim; retrying")

// Claim records the ids in tx and returns the new ones. Ids are sorted and
// deduplicated first (every claim locks in the same order). See the
// strategies (ClaimReturning, ClaimCount) and runtime/sink's comment.
func (s *Inbox) Claim(ctx context.Context, tx sink.Tx, claims []inbox.Claim) (map[string]struct{}, error) {
	t, err := sqlTx(tx)
	if err != nil {
		return nil, err
	}
	ids, fps := dedupe(claims)
	if len(ids) == 0 {
		return map[string]struct{}{}, nil
	}
	for _, id := range ids {
		if len(id) > maxIDBytes {
			return nil, fmt.Errorf("while claiming: message id of %d bytes is longer than the inbox column's %d", len(id), maxIDBytes)
		}
	}
	if s.layout == config.LayoutPartitioned {
		fresh, err := s.claimPartitioned(ctx, t, claims, ids, fps)
		return fresh, s.d.WithAdvice(err, s.names.Schema)
	}
	args := make([]any, 0, 2*len(ids))
	for i, id := range ids {
		var fp any
		if fps[i] != 0 {
			fp = fps[i]
		}
		args = append(args, idArg(id), fp)
	}
	var fresh map[string]struct{}
	if s.d.claim == ClaimReturning {
		fresh, err = s.claimReturning(ctx, t, ids, args)
	} else {
		fresh, err = s.claimCount(ctx, t, ids, args)
	}
	return fresh, s.d.WithAdvice(err, s.names.Schema)
}

func (s *Inbox) claimReturning(ctx context.Context, t *sql.Tx, ids []string, args []any) (map[string]struct{}, error) {
	rows, err := t.QueryContext(ctx, `INSERT IGNORE INTO `+s.inbox+` (message_id, fingerprint) VALUES `+
		placeholders(len(ids), 2)+` RETURNING message_id`, args...)
	if err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	fresh := make(map[string]struct{}, len(ids))
	if err := collect(rows, fresh); err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	return fresh, nil
}

// testHookAfterClaimRead, when set (tests only), runs between ClaimCount's
// read and its insert: where a concurrent claim of the same id lands.
var testHookAfterClaimRead func()

func (s *Inbox) claimCount(ctx context.Context, t *sql.Tx, ids []string, args []any) (map[string]struct{}, error) {
	in := make([]any, len(ids))
	for i := range ids {
		in[i] = args[2*i]
	}
	rows, err := t.QueryContext(ctx, `SELECT message_id FROM `+s.inbox+` WHERE message_id IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`) LOCK IN SHARE MODE`, in...)
	if err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	existing := make(map[string]struct{}, len(ids))
	if err := collect(rows, existing); err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(ids), err)
	}
	if testHookAfterClaimRead != nil {
		testHookAfterClaimRead()
	}
	fresh := make(map[string]struct{}, len(ids)-len(existing))
	insert := make([]any, 0, 2*(len(ids)-len(existing)))
	for i, id := range ids {
		if _, ok := existing[id]; !ok {
			fresh[id] = struct{}{}
			insert = append(insert, args[2*i], args[2*i+1])
		}
	}
	if len(fresh) == 0 {
		return fresh, nil
	}
	res, err := t.ExecContext(ctx, `INSERT INTO `+s.inbox+` (message_id, fingerprint) VALUES `+
		placeholders(len(fresh), 2)+` ON DUPLICATE KEY UPDATE message_id = message_id`, insert...)
	if err != nil {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %w", len(fresh), err)
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(fresh)) {
		return nil, fmt.Errorf("while claiming %d ids in the inbox: %d inserted: %w", len(fresh), n, ErrClaimRace)
	}
	return fresh, nil
}

func collect(rows *sql.Rows, into map[string]struct{}) error {
	defer func() { _ = rows.Close() }()
	var b []byte
	for rows.Next() {
		if err := rows.Scan(&b); err != nil {
			return err
		}
		into[string(b)] = struct{}{}
	}
	return rows.Err()
}

// unsafeBytes passes an id as bytes (VARBINARY) without the driver
// treating it as text in the connection's charset.
func idArg(s string) []byte { return []byte(s) }

// dedupe sorts the ids and drops in-batch repeats (the first claim wins).
func dedupe(claims []inbox.Claim) ([]string, []int64) {
	order := make([]int32, len(claims))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return strings.Compare(claims[a].MessageID, claims[b].MessageID) })
	ids := make([]string, 0, len(claims))
	fps := make([]int64, 0, len(claims))
	for k, i := range order {
		if k > 0 && claims[i].MessageID == claims[order[k-1]].MessageID {
			continue
		}
		ids = append(ids, claims[i].MessageID)
		fps = append(fps, claims[i].Fingerprint)
	}
	return ids, fps
}

// Unclaim releases ids claimed earlier in tx.
func (s *Inbox) Unclaim(ctx context.Context, tx sink.Tx, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	t, err := sqlTx(tx)
	if err != nil {
		return err
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = idArg(id)
	}
	if _, err := t.ExecContext(ctx, `DELETE FROM `+s.inbox+` WHERE message_id IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`)`, args...); err != nil {
		return fmt.Errorf("while releasing %d claimed ids: %w", len(ids), err)
	}
	return nil
}

// DeadLetter inserts the rows in tx, one per broker native id: the native
// ids already there are read first (dead letters are the rare path), the
// rest inserted in one statement.
func (s *Inbox) DeadLetter(ctx context.Context, tx sink.Tx, dls []inbox.DeadLetter) (_ []bool, err error) {
	defer s.advise(&err) // a privilege error names its GRANT
	if len(dls) == 0 {
		return nil, nil
	}
	t, err := sqlTx(tx)
	if err != nil {
		return nil, err
	}
	natives := make([]string, len(dls))
	var lookup []any
	for i, d := range dls {
		natives[i] = inbox.CleanText(d.NativeID)
		if natives[i] != "" {
			lookup = append(lookup, []byte(natives[i]))
		}
	}
	present := map[string]struct{}{}
	if len(lookup) > 0 {
		rows, err := t.QueryContext(ctx, `SELECT native_id FROM `+s.deadLetters+` WHERE native_id IN (`+
			strings.TrimSuffix(strings.Repeat("?, ", len(lookup)), ", ")+`) FOR UPDATE`, lookup...)
		if err != nil {
			return nil, fmt.Errorf("while inserting %d dead letters: %w", len(dls), err)
		}
		if err := collect(rows, present); err != nil {
			return nil, fmt.Errorf("while inserting %d dead letters: %w", len(dls), err)
		}
	}
	var args []any
	var inserted []string
	rowsN := 0
	for i, d := range dls {
		if natives[i] != "" {
			if _, dup := present[natives[i]]; dup {
				continue
			}
			present[natives[i]] = struct{}{} // a repeat in the batch is one row
			inserted = append(inserted, natives[i])
		}
		h, err := json.Marshal(inbox.CleanHeaders(d.Headers))
		if err != nil {
			return nil, fmt.Errorf("while encoding dead-letter headers: %w", err)
		}
		var published any
		if !d.PublishedAt.IsZero() {
			published = d.PublishedAt.UTC()
		}
		args = append(args, nullBytes(inbox.CleanText(d.MessageID)), nullBytes(natives[i]), inbox.CleanText(d.Reason),
			d.Payload, string(h), d.Attempts, published, nullText(inbox.CleanText(d.Class)))
		rowsN++
	}
	if rowsN > 0 {
		if _, err := t.ExecContext(ctx, `INSERT INTO `+s.deadLetters+`
			(message_id, native_id, reason, payload, headers, attempts, published_at, reason_class) VALUES `+
			placeholders(rowsN, 8), args...); err != nil {
			return nil, fmt.Errorf("while inserting %d dead letters: %w", rowsN, err)
		}
	}
	return inbox.InsertedRows(natives, inserted), nil
}

func nullBytes(s string) any {
	if s == "" {
		return nil
	}
	return []byte(s)
}

func nullText(s string) any {
	if s == "" {
		return nil
	}
	return s
}
