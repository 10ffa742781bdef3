package inbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempotency-dev/idc-operator/runtime/config"
)

// An inbox knows, in its own meta row, whom it belongs to and which
// generation of dedup state it holds (DESIGN.md section 9, "Evidence, not
// inference"):
//
//   - the owner: the cluster (the kube-system namespace's UID), the
//     resource's namespace, name and UID. The controller resolves an inbox
//     from the database itself, so two resources that reach one table
//     through different Secrets, namespaces or clusters find the same
//     owner, and the second is refused (OwnedError). Only the owner drops it
//     (DropOwned).
//   - the epoch: a random id minted when the inbox is created, kept by the
//     resource (status.inbox.epoch), in the runtime's config and in every
//     runtime's memory. A table dropped, re-created or restored from another
//     generation no longer matches, and a TRUNCATE of the inbox table (or of
//     one of its partitions) marks the epoch as truncated through a trigger:
//     each is a LostError, never an inbox re-created empty behind the
//     consumer's back.

// Owner is the resource an inbox belongs to.
type Owner struct {
	// Cluster identifies the Kubernetes cluster: its kube-system
	// namespace's UID.
	Cluster   string `json:"owner_cluster"`
	Namespace string `json:"owner_namespace"`
	Name      string `json:"owner_name"`
	UID       string `json:"owner_uid"`
}

// IsZero: no owner recorded (an inbox of schema version 6 or older, or one
// a runtime created before the controller claimed it).
func (o Owner) IsZero() bool { return o == Owner{} }

// Ref is what a person writes to adopt an inbox from this owner
// (OwnerClaim.AdoptFrom): cluster/namespace/name.
func (o Owner) Ref() string { return o.Cluster + "/" + o.Namespace + "/" + o.Name }

func (o Owner) String() string {
	return fmt.Sprintf("IdempotentConsumer %s/%s (uid %s) in cluster %s", o.Namespace, o.Name, o.UID, o.Cluster)
}

// sameResource: the same namespace/name in the same cluster. Its UID may
// differ: a resource restored without status, or replaced by Argo CD, is
// another object with the same name, and adopts.
func (o Owner) sameResource(p Owner) bool {
	return o.Cluster == p.Cluster && o.Namespace == p.Namespace && o.Name == p.Name
}

// Identity is what an inbox's meta row and marker say of it.
type Identity struct {
	Owner Owner
	// Epoch is the generation of the inbox's dedup state; "" before schema
	// version 7.
	Epoch string
	// Database names the physical database (PhysicalDatabase); the
	// controller fills it in.
	Database string
}

// OwnerClaim is what the controller asks of MigrateFor and Check.
type OwnerClaim struct {
	Owner Owner
	// Epoch is the epoch the resource knows (status.inbox.epoch); "" when
	// it knows none yet (a new resource, or one restored without status).
	Epoch string
	// AcceptLoss: a person accepted that the inbox of Epoch is lost and
	// that the consumer starts from the inbox as it now is (empty, or
	// another generation's). A new epoch is minted.
	AcceptLoss bool
	// AdoptFrom is the Ref of the recorded owner a person named: this
	// resource takes the inbox over from it.
	AdoptFrom string
}

// LostError: the inbox that held the claims of Epoch is gone or replaced.
// Deduplication against what it held is lost, so nothing may claim into
// what is there now until a person accepts it (OwnerClaim.AcceptLoss).
type LostError struct {
	Inbox string // schema-qualified, unquoted
	Epoch string // the epoch the consumer knows
	// What happened, in words: "the inbox tables do not exist", "the
	// inbox records epoch X", "its epoch marker row is gone".
	What string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("inbox %s lost the dedup state of epoch %s: %s", e.Inbox, e.Epoch, e.What)
}

// IsLost reports whether err is (or wraps) a *LostError.
func IsLost(err error) bool {
	var l *LostError
	return errors.As(err, &l)
}

// OwnedError: another resource owns the inbox.
type OwnedError struct {
	Inbox string // schema-qualified, unquoted
	Owner Owner
}

func (e *OwnedError) Error() string {
	return fmt.Sprintf("inbox %s belongs to %s", e.Inbox, e.Owner)
}

// ErrNotOwner is a DropOwned refused because the inbox records another
// owner, or none.
var ErrNotOwner = errors.New("the inbox records another owner")

// truncatedPrefix marks an epoch whose inbox table was truncated (the
// trigger truncationDDL installs writes it); restoredPrefix one the
// controller found older than its own record of it (MarkRestored).
const (
	truncatedPrefix = "truncated:"
	restoredPrefix  = "restored:"
)

// spoiled: the epoch was marked lost in place (truncated, restored).
func spoiled(epoch string) bool {
	return strings.HasPrefix(epoch, truncatedPrefix) || strings.HasPrefix(epoch, restoredPrefix)
}

// MarkRestored marks the inbox of epoch lost in its own meta row: the
// controller found it older than what the resource recorded of it (its
// latest prune run is from before the one in status.lastPrune: restored
// from an earlier backup, claims made since gone). Every runtime's guard
// then holds, and the controller reports InboxLost, until a person accepts.
func (s *Store) MarkRestored(ctx context.Context, epoch string) error {
	if _, err := s.pool.Exec(ctx, `UPDATE `+s.meta+` SET epoch = '`+restoredPrefix+`' || epoch WHERE epoch = $1`, epoch); err != nil {
		return fmt.Errorf("while marking inbox %s restored: %w", s.inbox, err)
	}
	return nil
}

// truncationDDL installs the trigger that marks the epoch truncated when
// the inbox table is: a statement trigger, which costs a claim nothing.
func (s *Store) truncationDDL() []string {
	fn := qualify(s.names.Schema, DerivedName(s.names.Inbox, "_truncated"))
	return []string{
		`CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $idc$
		BEGIN
			UPDATE ` + s.meta + ` SET epoch = '` + truncatedPrefix + `' || epoch WHERE epoch NOT LIKE '` + truncatedPrefix + `%';
			RETURN NULL;
		END $idc$`,
		s.truncationTrigger(s.inbox),
	}
}

// truncationTrigger (re)creates the trigger on table (the inbox, or one of
// its partitions: truncating a partition bypasses its parent's triggers).
func (s *Store) truncationTrigger(table string) string {
	fn := qualify(s.names.Schema, DerivedName(s.names.Inbox, "_truncated"))
	trg := ident("idc_inbox_truncated")
	return `DROP TRIGGER IF EXISTS ` + trg + ` ON ` + table + `;
		CREATE TRIGGER ` + trg + ` AFTER TRUNCATE ON ` + table + ` FOR EACH STATEMENT EXECUTE FUNCTION ` + fn + `()`
}

func newEpoch() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// metaRow is the meta row as JSON (to_jsonb), whatever its version's
// columns.
type metaRow struct {
	Layout        string `json:"layout"`
	SchemaVersion int    `json:"schema_version"`
	Epoch         string `json:"epoch"`
	Owner
}

// readIdentity fills st's identity from the meta row; the meta table
// exists.
func (s *Store) readIdentity(ctx context.Context, q Querier, st *inboxState) error {
	var raw []byte
	err := q.QueryRow(ctx, `SELECT to_jsonb(m) FROM `+s.meta+` m`).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("while reading the inbox meta row: %w", err)
	}
	var row metaRow
	if err := json.Unmarshal(raw, &row); err != nil {
		return fmt.Errorf("while reading the inbox meta row: %w", err)
	}
	st.layout, st.version, st.epoch, st.owner = row.Layout, row.SchemaVersion, row.Epoch, row.Owner
	return nil
}

// lost says why the inbox as read no longer holds the claims of epoch,
// "" when it does.
func (st inboxState) lost(epoch string) string {
	switch {
	case epoch == "":
		return ""
	case !st.hasMeta && !st.hasInbox:
		return "the inbox tables do not exist (dropped, or the database was replaced)"
	case !st.hasInbox:
		return "the inbox table does not exist (dropped)"
	case !st.hasMeta || st.version == 0:
		return "the inbox meta table or its row is gone"
	case st.epoch == truncatedPrefix+epoch:
		return "the inbox table was truncated"
	case st.epoch == restoredPrefix+epoch:
		return "the inbox is older than this resource's record of it: its latest prune run is from before the one in status.lastPrune (restored from an earlier backup?), so the claims made since are gone"
	case st.epoch != epoch:
		if st.epoch == "" {
			return "the inbox records no epoch (re-created, or restored from before it had one)"
		}
		return fmt.Sprintf("the inbox records epoch %s (re-created, or restored from another generation)", st.epoch)
	}
	return ""
}

func (s *Store) lostError(epoch, what string) *LostError {
	return &LostError{Inbox: s.names.Schema + "." + s.names.Inbox, Epoch: epoch, What: what}
}

func (s *Store) ownedError(o Owner) *OwnedError {
	return &OwnedError{Inbox: s.names.Schema + "." + s.names.Inbox, Owner: o}
}

// refusal is the error MigrateFor(c) returns at once for st, nil when it
// may proceed: the inbox lost (unless accepted), or another owner's
// (unless adopted by name).
func (s *Store) refusal(st inboxState, c *OwnerClaim) error {
	epoch := s.expectEpoch
	if c != nil {
		epoch = c.Epoch
	}
	if what := st.lost(epoch); what != "" && (c == nil || !c.AcceptLoss) {
		return s.lostError(epoch, what)
	}
	if c != nil && !st.owner.IsZero() && !st.owner.sameResource(c.Owner) && c.AdoptFrom != st.owner.Ref() {
		return s.ownedError(st.owner)
	}
	return nil
}

// identityDone: nothing about the inbox's identity is left to write for c.
func (st inboxState) identityDone(c *OwnerClaim) bool {
	return st.epoch != "" && !spoiled(st.epoch) && (c == nil || st.owner == c.Owner && !c.AcceptLoss)
}

// writeIdentity records c's owner (when c is set) and, when the inbox has
// no epoch yet (or a truncated one) or a person accepted a loss, mints an
// epoch and installs the truncation trigger; in the migration transaction.
func (s *Store) writeIdentity(ctx context.Context, tx pgx.Tx, st inboxState, c *OwnerClaim) (string, error) {
	epoch := st.epoch
	if epoch == "" || spoiled(epoch) || (c != nil && c.AcceptLoss) {
		epoch = newEpoch()
		stmts := append(s.truncationDDL(), `UPDATE `+s.meta+` SET epoch = `+literal(epoch))
		if s.layout == config.LayoutPartitioned {
			parts, err := s.listPartitionsIn(ctx, tx)
			if err != nil {
				return "", err
			}
			for _, p := range parts {
				stmts = append(stmts, s.truncationTrigger(qualify(s.names.Schema, p.name)))
			}
		}
		if err := execAll(ctx, tx, stmts); err != nil {
			return "", fmt.Errorf("while recording the inbox epoch: %w", err)
		}
	}
	if c != nil && st.owner != c.Owner {
		_, err := tx.Exec(ctx, `UPDATE `+s.meta+` SET owner_cluster = $1, owner_namespace = $2, owner_name = $3, owner_uid = $4`,
			c.Owner.Cluster, c.Owner.Namespace, c.Owner.Name, c.Owner.UID)
		if err != nil {
			return "", fmt.Errorf("while recording the inbox owner: %w", err)
		}
	}
	return epoch, nil
}

// PhysicalDatabase names the database q reaches, from PostgreSQL itself:
// its system identifier and the database name ("7715137733552269475/app").
// A role that may not call pg_control_system() (some managed services
// revoke it) gets "unknown/<database>".
func PhysicalDatabase(ctx context.Context, q Querier) (string, error) {
	var db string
	if err := q.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return "", fmt.Errorf("while reading the database name: %w", err)
	}
	var sysid int64
	err := q.QueryRow(ctx, `SELECT system_identifier FROM pg_control_system()`).Scan(&sysid)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return "unknown/" + db, nil
	case err != nil:
		return "", fmt.Errorf("while reading the database's system identifier: %w", err)
	}
	return fmt.Sprintf("%d/%s", sysid, db), nil
}

// Check reads the inbox's state without a transaction or lock: the
// question the controller asks on every pass. ready is true when the inbox
// is at this schema version, owned by c.Owner exactly and holds c.Epoch
// intact, so MigrateFor(c) would have nothing to do; a lost inbox or
// another owner's is refused at once (LostError, OwnedError).
func (s *Store) Check(ctx context.Context, c OwnerClaim) (id Identity, version int, ready bool, err error) {
	st, err := s.readState(ctx, s.pool)
	if err != nil {
		return id, 0, false, err
	}
	if err := s.refusal(st, &c); err != nil {
		return id, st.version, false, err
	}
	id.Owner, id.Epoch = st.owner, st.epoch
	return id, st.version, s.upToDate(st) && st.identityDone(&c), nil
}

// Verify is the runtime's check that the inbox it claims into still holds
// the epoch it started with (WithExpectedEpoch): a *LostError when not,
// nil when it does or no epoch is expected.
func (s *Store) Verify(ctx context.Context) error {
	if s.expectEpoch == "" {
		return nil
	}
	st, err := s.readState(ctx, s.pool)
	if err != nil {
		return err
	}
	if what := st.lost(s.expectEpoch); what != "" {
		return s.lostError(s.expectEpoch, what)
	}
	return nil
}

// Epoch reads the epoch the inbox records ("" when none, or when the inbox
// does not exist).
func (s *Store) Epoch(ctx context.Context) (string, error) {
	st, err := s.readState(ctx, s.pool)
	return st.epoch, err
}
