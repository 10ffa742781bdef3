package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// chaosStats is what the driver did.
type chaosStats struct {
	driverKills    int // SIGKILLs sent by the driver
	failpointKills int // replicas that SIGKILLed themselves between COMMIT and ack
	cuts           int // rounds of connection cuts (pg_terminate_backend, KILL CONNECTION) that hit a runtime session
	backendsCut    int
	busyKills      int           // driver kills while the victim's consumer had undelivered messages
	busyCuts       int           // cuts while a consumer had undelivered messages
	busyFor        time.Duration // how long some consumer had undelivered messages
	armedStarts    int
	starts         int
	unexpected     []string // exits nobody caused
}

func (s chaosStats) kills() int { return s.driverKills + s.failpointKills }

func (s chaosStats) String() string {
	return fmt.Sprintf("kills=%d (driver %d of which %d under backlog, failpoint %d), cuts=%d (%d under backlog, %d backends), starts=%d (%d armed), backlog for %s",
		s.kills(), s.driverKills, s.busyKills, s.failpointKills, s.cuts, s.busyCuts, s.backendsCut, s.starts, s.armedStarts, s.busyFor)
}

// driver owns the replicas: it starts them, injects the faults, and
// restarts whatever died. Everything runs on the goroutine of chaos and
// settle, so no field needs a lock.
type driver struct {
	sz        size
	fleet     *fleet
	reps      []*replica
	rng       *rand.Rand
	cutter    cutter
	stream    *stream
	pub       *publisher
	st        chaosStats
	arming    bool // restarts may arm the failpoint (the chaos phase)
	restartCh chan *replica
	pending   int // restarts scheduled and not yet done
}

func newDriver(sz size, f *fleet, reps []*replica, cutter cutter, s *stream, pub *publisher, seed uint64) *driver {
	return &driver{sz: sz, fleet: f, reps: reps, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		cutter: cutter, stream: s, pub: pub, restartCh: make(chan *replica, 2*len(reps))}
}

func (d *driver) startAll() error {
	for _, r := range d.reps {
		if err := d.start(r); err != nil {
			return err
		}
	}
	return nil
}

// start runs the replica, armed with the failpoint while the chaos phase
// still owes failpoint kills, else now and then.
func (d *driver) start(r *replica) error {
	armed := d.arming && (d.armedLive()+d.st.failpointKills < d.sz.minFailpoint ||
		(d.armedLive() < 2 && d.rng.Float64() < d.sz.armShare))
	if _, err := d.fleet.start(r, armed); err != nil {
		return err
	}
	d.st.starts++
	if armed {
		d.st.armedStarts++
	}
	return nil
}

func (d *driver) armedLive() int {
	n := 0
	for _, r := range d.reps {
		if r.cur != nil && r.cur.armed {
			n++
		}
	}
	return n
}

// pollEvery is how often the chaos phase looks at the consumers' backlog.
const pollEvery = 100 * time.Millisecond

// chaos injects faults at random moments until the publisher is done, the
// backlog is drained and every minimum is met. The random gap between two
// faults only runs down while a consumer has undelivered messages, so the
// faults land while replicas are mid-batch, not in an idle wait; once
// everything is published and drained, faults still owed land anyway.
//
// The publisher holds back a reserve after its timed bursts. While
// failpoint kills are owed and nothing is undelivered, the driver releases
// one chunk of it once an armed replica has been up long enough to be
// pulling (a failpoint fires only on a commit, so it needs work), or kills
// an unarmed replica so that its restart is armed. With the failpoints
// done, the rest goes out at once.
func (d *driver) chaos(ctx context.Context) error {
	d.arming = true
	defer func() { d.arming = false }()
	owed := d.nextGap()
	return d.loop(ctx, func() time.Duration { return pollEvery }, func() (bool, error) {
		busy, err := d.backlog(ctx)
		if err != nil {
			return false, err
		}
		published := d.published()
		if published && len(busy) == 0 && d.enough() {
			return true, nil
		}
		if len(busy) > 0 {
			d.st.busyFor += pollEvery
		}
		if len(busy) == 0 && !published {
			return false, d.between(ctx)
		}
		if owed -= pollEvery; owed > 0 {
			return false, nil
		}
		owed = d.nextGap()
		return false, d.act(ctx, busy)
	})
}

// between runs while nothing is undelivered and the publisher is not done:
// between two timed bursts it waits; once the reserve is held, it releases
// it as chaos describes.
func (d *driver) between(ctx context.Context) error {
	select {
	case <-d.pub.held:
	default:
		return nil // between bursts: wait for work
	}
	if d.st.failpointKills >= d.sz.minFailpoint {
		return d.releaseReserve(ctx, true)
	}
	if d.armedWorking() {
		return d.releaseReserve(ctx, false)
	}
	if d.pending > 0 || d.armedLive() > 0 {
		return nil // an armed restart is on its way up
	}
	if victim := d.victim(nil); victim != nil {
		victim.killed.Store(true)
		_ = victim.cmd.Process.Kill() // counted in onExit; the restart is armed
	}
	return nil
}

// releaseReserve hands the publisher one chunk of the reserve, or all of it.
func (d *driver) releaseReserve(ctx context.Context, all bool) error {
	select {
	case d.pub.release <- all:
		return nil
	case <-d.pub.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// armedWorking: an armed replica has been up long enough to be pulling.
func (d *driver) armedWorking() bool {
	for _, r := range d.reps {
		if p := r.cur; p != nil && p.armed && !p.killed.Load() && time.Since(p.started) > time.Second {
			return true
		}
	}
	return false
}

func (d *driver) published() bool {
	select {
	case <-d.pub.done:
		return true
	default:
		return false
	}
}

func (d *driver) enough() bool {
	return d.st.kills() >= d.sz.minKills && d.st.failpointKills >= d.sz.minFailpoint && d.st.cuts >= d.sz.minCuts
}

// backlog returns the consumers that have undelivered messages.
func (d *driver) backlog(ctx context.Context) (map[string]bool, error) {
	busy := map[string]bool{}
	for _, c := range consumers {
		pending, _, err := d.stream.outstanding(ctx, c)
		if err != nil {
			return nil, err
		}
		if pending > 0 {
			busy[c] = true
		}
	}
	return busy, nil
}

func (d *driver) nextGap() time.Duration {
	return d.sz.gapMin + time.Duration(d.rng.Int64N(int64(d.sz.gapMax-d.sz.gapMin)+1))
}

// settle keeps restarting whatever dies (a failpoint may still fire) until
// every replica runs and settled reports true.
func (d *driver) settle(ctx context.Context, settled func(context.Context) (bool, error)) error {
	return d.loop(ctx, func() time.Duration { return 300 * time.Millisecond }, func() (bool, error) {
		if d.pending > 0 || d.down() > 0 {
			return false, nil
		}
		return settled(ctx)
	})
}

func (d *driver) down() int {
	n := 0
	for _, r := range d.reps {
		if r.cur == nil {
			n++
		}
	}
	return n
}

func (d *driver) loop(ctx context.Context, gap func() time.Duration, tick func() (bool, error)) error {
	timer := time.NewTimer(gap())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up: %w (%s)", ctx.Err(), d.st)
		case p := <-d.fleet.exits:
			d.onExit(p)
		case r := <-d.restartCh:
			d.pending--
			if err := d.start(r); err != nil {
				return err
			}
		case <-timer.C:
			done, err := tick()
			if err != nil || done {
				return err
			}
			timer.Reset(gap())
		}
	}
}

// onExit classifies an exit and schedules the restart, as the Deployment's
// ReplicaSet would.
func (d *driver) onExit(p *proc) {
	if p.stopped.Load() || p.rep.cur != p {
		return
	}
	switch {
	case p.killed.Load() && p.sigkilled():
		d.st.driverKills++
	case p.armed && p.sigkilled():
		d.st.failpointKills++
	default:
		d.st.unexpected = append(d.st.unexpected, fmt.Sprintf("%s exited on its own (%s); log tail:\n%s",
			p.rep.name, p.state, tail(p.logPath, 30)))
	}
	p.rep.cur = nil
	d.pending++
	r := p.rep
	time.AfterFunc(time.Duration(d.rng.Int64N(int64(d.sz.restartMax)+1)), func() { d.restartCh <- r })
}

// act kills a random replica or cuts the database connections, whichever
// is still owed, else at random.
func (d *driver) act(ctx context.Context, busy map[string]bool) error {
	if victim := d.victim(busy); victim != nil && !d.cutNext() {
		victim.killed.Store(true)
		// The exit (and so the kill) is counted in onExit.
		_ = victim.cmd.Process.Kill()
		if busy[victim.rep.group()] {
			d.st.busyKills++
		}
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := d.cutter.cut(cctx)
	if err != nil {
		return err
	}
	if n > 0 {
		d.st.cuts++
		d.st.backendsCut += n
		if len(busy) > 0 {
			d.st.busyCuts++
		}
	}
	return nil
}

func (d *driver) cutNext() bool {
	killsOwed := d.st.kills() < d.sz.minKills
	cutsOwed := d.st.cuts < d.sz.minCuts
	if killsOwed != cutsOwed {
		return cutsOwed
	}
	return d.rng.Float64() < d.sz.cutShare
}

// victim picks a running, unarmed process (an armed one is left to its
// failpoint) of a random consumer that has a backlog (any consumer when
// none has), preferring one that has been up long enough to be working.
func (d *driver) victim(busy map[string]bool) *proc {
	group := ""
	if len(busy) > 0 {
		groups := make([]string, 0, len(busy))
		for _, c := range consumers {
			if busy[c] {
				groups = append(groups, c)
			}
		}
		group = groups[d.rng.IntN(len(groups))]
	}
	var working, running []*proc
	for _, r := range d.reps {
		p := r.cur
		if p == nil || p.armed || p.killed.Load() || (group != "" && r.group() != group) {
			continue
		}
		running = append(running, p)
		if time.Since(p.started) > time.Second {
			working = append(working, p)
		}
	}
	if len(working) > 0 {
		return working[d.rng.IntN(len(working))]
	}
	if len(running) > 0 {
		return running[d.rng.IntN(len(running))]
	}
	return nil
}
