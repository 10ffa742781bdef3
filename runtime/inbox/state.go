package inbox

import "github.com/idempotency-dev/idc-operator/runtime/config"

// State is what an inbox's catalog and meta row say of it, for the sink
// dialects that read them with their own statements (runtime/sink/mysql):
// the identity decisions (lost, refused, epoch to mint) are made here, once
// for every dialect.
type State struct {
	// Version is 0 when not migrated.
	Version                int
	Layout                 string
	HasInbox, HasMeta      bool
	HasOutbox, HasRedrives bool
	Epoch                  string
	Owner                  Owner
}

func (st State) internal() inboxState {
	return inboxState{version: st.Version, layout: st.Layout, hasInbox: st.HasInbox, hasMeta: st.HasMeta,
		hasOutbox: st.HasOutbox, hasRedrives: st.HasRedrives, epoch: st.Epoch, owner: st.Owner}
}

// Fresh: nothing of the inbox exists yet.
func (st State) Fresh() bool { return st.internal().fresh() }

// Lost says why the inbox no longer holds the claims of epoch, "" when it
// does (or epoch is "").
func (st State) Lost(epoch string) string { return st.internal().lost(epoch) }

// IdentityDone: nothing about the identity is left to write for c.
func (st State) IdentityDone(c *OwnerClaim) bool { return st.internal().identityDone(c) }

// NeedsEpoch: a new epoch is to be minted (none yet, a truncated or
// restored one, or a loss a person accepted).
func (st State) NeedsEpoch(c *OwnerClaim) bool {
	return st.Epoch == "" || spoiled(st.Epoch) || (c != nil && c.AcceptLoss)
}

// Refusal is the error a migration for c (or, with c nil, a runtime
// expecting expectEpoch) returns at once: a *LostError unless accepted, an
// *OwnedError for another resource's inbox unless adopted by name. name is
// the inbox as "<schema>.<table>".
func (st State) Refusal(name, expectEpoch string, c *OwnerClaim) error {
	epoch := expectEpoch
	if c != nil {
		epoch = c.Epoch
	}
	if what := st.Lost(epoch); what != "" && (c == nil || !c.AcceptLoss) {
		return &LostError{Inbox: name, Epoch: epoch, What: what}
	}
	if c != nil && !st.Owner.IsZero() && !st.Owner.sameResource(c.Owner) && c.AdoptFrom != st.Owner.Ref() {
		return &OwnedError{Inbox: name, Owner: st.Owner}
	}
	return nil
}

// NewEpoch mints an epoch.
func NewEpoch() string { return newEpoch() }

// TruncatedEpoch is how an epoch reads once its inbox was truncated.
func TruncatedEpoch(epoch string) string { return truncatedPrefix + epoch }

// DerivedNameMax is DerivedName for a database that keeps max characters
// of an identifier (MySQL: 64).
func DerivedNameMax(base, suffix string, max int) string { return derivedName(base, suffix, max) }

// NamesForMax is NamesFor with derived names kept to max characters.
func NamesForMax(sink config.Sink, max int) Names { return namesFor(sink, max) }

// CleanText makes s storable in a text column of any sink database: valid
// UTF-8, no NUL bytes (see DeadLetter).
func CleanText(s string) string { return cleanText(s) }

// CleanHeaders is CleanText over the keys and values of h.
func CleanHeaders(h map[string]string) map[string]string { return cleanHeaders(h) }

// InsertedRows maps the native ids a dialect found newly inserted onto the
// input rows (see DeadLetter): a row without a native id is always new; of
// several rows sharing one, only the first.
func InsertedRows(natives, inserted []string) []bool { return insertedRows(natives, inserted) }

// ErrProgressMoved is what MarkStale returns when the replica heartbeat
// since its row was read (IsProgressMoved), for every dialect.
var ErrProgressMoved = errProgressMoved
