package jetstream

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// reqState is where a pull request is in its life. The Source holds at most
// one request ahead (sent or open), at most one late request, and the
// retired ones whose drains still run; an ended request is dropped.
//
//	sent ──take part / stall──▶ open ──past its expiry──▶ late ──a newer one late──▶ retired
//	  │                          │                          │                          │
//	  └──────────────────────────┴───────── ended ◀─────────┴──────────────────────────┘
//
// A long poll collected whole (batching Fixed) goes from sent to late past
// its expiry. Ended: every message it asked for was taken, nats.go ended its
// batch (the server's status, an error, or nats.go's own idle timeout), the
// Fetch was cancelled, or it was given back (Close, a smaller Fetch).
type reqState int

const (
	// reqSent: sent, nothing taken yet. With batching Fixed a Fetch
	// collects a no-wait request to its end.
	reqSent reqState = iota
	// reqOpen: a Fetch took part of it, or it is a waiting request
	// (batching Adaptive) whose first message a Fetch waits for; the next
	// Fetch takes what it delivered so far instead of waiting for it to
	// complete.
	reqOpen
	// reqLate: a waiting request given up past its expiry
	// (Timing.ExpiryGrace) that may still deliver (the server was late, not
	// silent): the next Fetch takes what it delivered, before the request
	// ahead.
	reqLate
	// reqRetired: a late request replaced by a newer late one. A drain
	// gives back (NAK) what it still delivers, so that is redelivered at
	// once instead of after AckWait; Close stops the drains and waits for
	// them.
	reqRetired
	// reqEnded: nothing more is taken from it.
	reqEnded
)

var reqStateNames = [...]string{reqSent: "sent", reqOpen: "open", reqLate: "late", reqRetired: "retired", reqEnded: "ended"}

func (s reqState) String() string {
	if int(s) < len(reqStateNames) {
		return reqStateNames[s]
	}
	return "reqState(" + strconv.Itoa(int(s)) + ")"
}

// transitions are the moves a pull request may make. Any other is a bug:
// it is logged and counted (Source.invalidMoves), which the tests check.
var transitions = map[reqState][]reqState{
	reqSent:    {reqOpen, reqLate, reqEnded},
	reqOpen:    {reqLate, reqEnded},
	reqLate:    {reqRetired, reqEnded},
	reqRetired: {reqEnded},
}

func canMove(from, to reqState) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// pullRequest is one pull request the adapter sent and has not dropped.
type pullRequest struct {
	batch jetstream.MessageBatch
	// n is how many messages it asked for, taken how many were taken.
	n, taken int
	// until is, for a waiting request on a server that may drop it
	// without a status (Timing.ExpiryGrace), a time by which the server
	// has expired it for sure; past it the request is given up. Zero:
	// never (a no-wait request, or a server that ends every expired
	// request with a 408).
	until time.Time
	state reqState
}

func newRequest(batch jetstream.MessageBatch, n int, state reqState, until time.Time) *pullRequest {
	return &pullRequest{batch: batch, n: n, state: state, until: until}
}

// live says the request is still the one ahead: sent or open.
func (r *pullRequest) live() bool { return r.state == reqSent || r.state == reqOpen }

// complete says every message it asked for was taken (nats.go closes the
// batch right after the last).
func (r *pullRequest) complete() bool { return r.taken >= r.n }

// expiry fires when the request is past until (never when until is zero).
// Call stop when done.
func (r *pullRequest) expiry() (expired <-chan time.Time, stop func() bool) {
	if r.until.IsZero() {
		return nil, func() bool { return false }
	}
	t := time.NewTimer(time.Until(r.until))
	return t.C, t.Stop
}

// move makes r's transition to next, reporting one the state machine does
// not allow.
func (s *Source) move(r *pullRequest, next reqState) {
	if r.state == next {
		return
	}
	if !canMove(r.state, next) {
		s.invalidMoves.Add(1)
		s.log.Error(nil, "BUG: invalid JetStream pull request transition", "from", r.state.String(), "to", next.String())
	}
	r.state = next
}

// end drops r: nothing more is taken from it.
func (s *Source) end(r *pullRequest) { s.move(r, reqEnded) }

// keepOpen marks a request that a Fetch took part of (or waited on) and
// that has more to give: the next Fetch takes what it delivers.
func (s *Source) keepOpen(r *pullRequest) {
	if r.state == reqSent {
		s.move(r, reqOpen)
	}
}

// retire gives up on a waiting request past its expiry: it becomes the late
// request, whose messages the next Fetch takes if it delivers any. A late
// request still there from before is retired: a drain gives back what it
// delivered and still delivers, until nats.go ends its batch (maxWait + 1 s
// after its last message) or Close stops it. Only a server that drops
// expired requests without a status (before 2.10) gets here: with 2.10 and
// later Timing.ExpiryGrace is zero and no request is given up.
func (s *Source) retire(r *pullRequest) {
	s.move(r, reqLate)
	if prev := s.late; prev != nil && prev != r {
		s.drain(prev)
	}
	s.late = r
}

// drain starts the goroutine that gives back what the retired request r
// delivers; Close stops it and waits for it (stopDrains).
func (s *Source) drain(r *pullRequest) {
	s.move(r, reqRetired)
	s.retiredMu.Lock()
	s.retired = append(s.retired, r)
	s.retiredMu.Unlock()
	s.drains.Add(1)
	go func() {
		defer s.drains.Done()
		defer s.dropRetired(r)
		for {
			select {
			case m, ok := <-r.batch.Messages():
				if !ok {
					return
				}
				_ = m.Nak()
			case <-s.closing:
				// What has arrived goes back now; what is still on its way
				// is redelivered after AckWait.
				for m, ok := ready(r.batch); ok && m != nil; m, ok = ready(r.batch) {
					_ = m.Nak()
				}
				return
			}
		}
	}()
}

func (s *Source) dropRetired(r *pullRequest) {
	s.retiredMu.Lock()
	defer s.retiredMu.Unlock()
	s.end(r)
	for i, o := range s.retired {
		if o == r {
			s.retired = append(s.retired[:i], s.retired[i+1:]...)
			break
		}
	}
}

// retiredCount is how many retired requests' drains still run.
func (s *Source) retiredCount() int {
	s.retiredMu.Lock()
	defer s.retiredMu.Unlock()
	return len(s.retired)
}

// stopDrains stops every drain and waits until all have returned.
func (s *Source) stopDrains() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.drains.Wait()
}

// Timing holds the adapter's waits that work around what a server does or
// fails to do. The defaults depend on the server (DefaultTiming).
type Timing struct {
	// ExpiryGrace is how long after a waiting request's expiry (its
	// maxWait from when it was sent) the adapter stops waiting for it and
	// gives it up (it becomes late). Zero: never; the server's "408 Request
	// Timeout" ends every expired request. A server without
	// nats-server#3942 (fixed in 2.9.16; Debian's 2.9.10 lacks it) that
	// finds a request expired while it hands out a new message drops it
	// without the status, and nats.go ends its batch only a second after
	// its last message. Measured at 10% load with two replicas (issue 24):
	// 12 long polls in 12 s ended so, 1.2 s after they were sent, and while
	// both replicas waited on dead requests the consumer had no pull
	// request on the server and every message published waited (the
	// one-second stalls that set the p99). The grace covers the request's
	// way to the server and the last message's way back; a request that
	// delivers later still (a loaded server) is the late request, and what
	// it delivers is not lost.
	ExpiryGrace time.Duration
	// FillGap bounds the wait for the next message of a burst the server
	// said is pending (a backlog): a batch fills from it, but a message
	// another replica's request took is not waited for longer than this.
	FillGap time.Duration
	// NoWaitStall bounds the wait on a no-wait request that has gone quiet
	// (zero: no bound). The server answers one at once unless it cannot
	// deliver what was pending when it arrived: another replica's waiting
	// request took those messages (2.9 leaves the request unanswered;
	// 2.10 and later answer "408 Requests Pending" when they see it on
	// arrival, not when the race is lost later), or the consumer is at
	// MaxAckPending (every version holds the request). nats.go then ends it
	// only after a second (measured: one-second stalls of the whole loop
	// at 10% load with two replicas). Past this bound the request is kept
	// open: the next Fetch takes what it still delivers, so nothing is
	// stranded.
	NoWaitStall time.Duration
}

// The defaults, tuned on this machine against nats-server 2.9.10.
const (
	defaultExpiryGrace = 20 * time.Millisecond
	defaultFillGap     = 20 * time.Millisecond
	defaultNoWaitStall = 50 * time.Millisecond
)

// serverCaps is what the adapter relies on a server for.
type serverCaps struct {
	// expiryStatus: every expired pull request ends with a 408 status
	// (nats-server#3942, 2.9.16). Trusted from 2.10 on, the first release
	// line that has it in every version, and the one this adapter's tests
	// run on (2.15.3 beside 2.9.10); 2.10 also answers a no-wait request it
	// cannot serve (408 Requests Pending) and sends heartbeats on pull
	// requests that ask for them.
	expiryStatus bool
}

// capsOf reads a server's version as its INFO reports it ("2.9.10",
// "v2.11.0-RC.1"). One it cannot read is taken as old: the workarounds run.
func capsOf(version string) serverCaps {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return serverCaps{}
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return serverCaps{}
	}
	return serverCaps{expiryStatus: major > 2 || (major == 2 && minor >= 10)}
}

// DefaultTiming is the Timing for a server of the given version: the
// expiry workaround only where the server needs it.
func DefaultTiming(serverVersion string) Timing {
	t := Timing{FillGap: defaultFillGap, NoWaitStall: defaultNoWaitStall}
	if !capsOf(serverVersion).expiryStatus {
		t.ExpiryGrace = defaultExpiryGrace
	}
	return t
}

func (t Timing) String() string {
	grace := "off (the server ends expired requests)"
	if t.ExpiryGrace > 0 {
		grace = t.ExpiryGrace.String()
	}
	return fmt.Sprintf("expiryGrace %s, fillGap %s, noWaitStall %s", grace, t.FillGap, t.NoWaitStall)
}
