package mpiam

import (
	"fmt"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/mpiam/internal/proto"
)

// Barriers over active messages.
//
// A dissemination barrier (Hensgen, Finkel and Manber 1988; MPICH's and
// GASNet's barrier for small jobs) runs ceil(log2 n) rounds; in round r rank
// i tells rank i+2^r that it got there and waits to hear from rank i-2^r.
// The message carries nothing but the communicator's context and the round,
// so amgo sends it as a short active message whose handler only counts it:
// no envelope, no matching, no request, no unexpected list. The count is per
// (communicator, round) and only grows:
//
//	rank i may leave round r of its barrier number e (0, 1, ... in the order
//	the rank called Barrier or Ibarrier on the communicator) once it has
//	counted at least e+1 round-r messages.
//
// Messages from one rank arrive in order and always come from the same
// neighbour in a given round, so e+1 of them mean the neighbour has passed
// round r-1 of some barrier numbered e or later — and a rank that entered a
// later barrier entered every earlier one. The invariant of the
// dissemination barrier (after round r, ranks i-1 ... i-2^(r+1)+1 have entered
// barrier e) therefore holds by induction over r even when a rank's next
// barrier's messages overtake the current one's, and even with several
// Ibarriers in flight at once. (A Barrier on one rank and an Ibarrier on
// another match here, though MPI-4.1 §6.12 says that blocking and
// nonblocking collectives never do; between ranks of one node, Barrier goes
// through the shared area of coll_shm.go instead and does not match.)
//
// A tool's piggybacked value (Piggybacker) rides in the short message's
// header. The handler keeps it in a small ring per round, stamped with the
// message's index among its round's messages; round r of barrier e takes the
// value stamped e (the neighbour's value from its barrier e when barriers
// follow one another; with several Ibarriers in flight it may be the
// neighbour's value from one of the others, or none).

// maxBarrierRounds bounds the rounds of a barrier: ceil(log2 n) for n up to 2^40.
const maxBarrierRounds = proto.MaxBarrierRounds

// barrierPBSlots is the depth of the ring of piggybacked values per round.
const barrierPBSlots = 4

// barrierCounts counts the barrier messages this rank received on one
// communicator, by round. The handler adds; waiting callers read.
type barrierCounts struct {
	n [maxBarrierRounds]atomic.Uint64
	// pbs holds piggybacked values by round (p.mu); allocated by the first
	// message that carries one.
	pbs *[maxBarrierRounds][barrierPBSlots]barrierPB
}

// barrierPB is a value piggybacked on the message numbered msg (its index
// among its round's messages).
type barrierPB struct {
	msg, v uint64
	has    bool
}

// byContextLocked returns the entry of context ctx in *m, creating it (and
// the map): a peer may send a collective's message on a communicator before
// this rank has finished creating it. Context ids are never reused. p.mu
// held.
func byContextLocked[T any](m *map[uint32]*T, ctx uint32) *T {
	v := (*m)[ctx]
	if v == nil {
		if *m == nil {
			*m = map[uint32]*T{}
		}
		v = new(T)
		(*m)[ctx] = v
	}
	return v
}

// cachedByContext is c's entry in *m (byContextLocked), looked up once and
// then kept in c's slot. Goroutines that get here at once all store the same
// entry.
func cachedByContext[T any](c *Comm, slot *atomic.Pointer[T], m *map[uint32]*T) *T {
	v := slot.Load()
	if v == nil {
		c.p.mu.Lock()
		v = byContextLocked(m, c.ctx)
		c.p.mu.Unlock()
		slot.Store(v)
	}
	return v
}

// onBarrier counts a barrier message: a[0] is the communicator's context,
// a[1] the round.
func (p *proc) onBarrier(tok *handlers.Token, a []uint64, _ []byte) {
	m, err := proto.ParseBarrier(a)
	if err != nil {
		p.dropped(fmt.Errorf("from rank %d: %w", tok.Source(), err))
		return
	}
	r := m.Round
	p.mu.Lock()
	b := byContextLocked(&p.barrierCounts, m.Context)
	if v, ok := tok.Piggyback(); ok {
		if b.pbs == nil {
			b.pbs = new([maxBarrierRounds][barrierPBSlots]barrierPB)
		}
		k := b.n[r].Load() // handlers run one at a time: this message's index
		b.pbs[r][k%barrierPBSlots] = barrierPB{msg: k, v: v, has: true}
	}
	b.n[r].Add(1)
	p.mu.Unlock()
}

// observeBarrierPB gives collective call x the value piggybacked on the
// round-r message of its barrier, if it carried one.
func (x coll) observeBarrierPB(b *barrierCounts, r int) {
	p := x.c.p
	p.mu.Lock()
	var s barrierPB
	if b.pbs != nil {
		s = b.pbs[r][x.epoch%barrierPBSlots]
	}
	p.mu.Unlock()
	if s.has && s.msg == x.epoch {
		x.observe(Status{Piggyback: s.v, HasPiggyback: true})
	}
}

// barrier is the dissemination barrier of collective call x over active
// messages.
func (x coll) barrier() error {
	c := x.c
	p := c.p
	if c.size == 1 {
		return nil
	}
	if x.v == nil {
		if a := c.shmArea(); a != nil {
			// It sends no barrier message, so takes no number among the
			// message barriers (every rank alike).
			return a.barrier(x)
		}
	}
	x.epoch = c.barriers.Add(1) - 1 // shared with Ibarrier: both match the same messages
	if l := x.nodeLevels(); l != nil {
		return x.barrierNodes(l)
	}
	bar := cachedByContext(c, &c.bar, &p.barrierCounts)
	if err := p.collFailed(c); err != nil {
		return err
	}
	for r, dist := 0, 1; dist < c.size; r, dist = r+1, dist*2 {
		to := c.world((c.rank + dist) % c.size)
		var buf [proto.BarrierArgs]uint64
		var pb handlers.Piggyback
		if x.pb != nil {
			pb.Value, _ = x.outgoing()
			pb.Set = true
		}
		err := p.ep.RequestShortWith(to, hBarrier, pb, (&proto.Barrier{Context: c.ctx, Round: uint32(r)}).Append(buf[:0])...)
		if err != nil {
			return p.netErr(c, to, fmt.Sprintf("barrier on communicator %d", c.ctx), err)
		}
		n, want := &bar.n[r], x.epoch
		if err := p.waitColl(c, func() bool { return n.Load() > want }); err != nil {
			return err
		}
		if x.pb != nil {
			x.observeBarrierPB(bar, r)
		}
	}
	return nil
}

// collFailed reports ErrProcFailed when a rank of c has failed: a collective
// on c cannot complete (the same rule as for receives on c's collective
// context, failure.go).
func (p *proc) collFailed(c *Comm) error {
	if !p.fail.any.Load() {
		return nil
	}
	p.mu.Lock()
	w := p.commDeadLocked(c)
	p.mu.Unlock()
	if w >= 0 {
		return p.procFailed(c, w, fmt.Sprintf("collective on communicator %d", c.ctx))
	}
	return nil
}

// waitColl polls until done holds, or fails when a rank of c fails meanwhile.
func (p *proc) waitColl(c *Comm, done func() bool) error {
	for {
		seen := p.fail.seen.Load()
		if err := p.waitFor(func() bool { return done() || p.fail.seen.Load() != seen }); err != nil {
			return err
		}
		if done() {
			return nil
		}
		if err := p.collFailed(c); err != nil {
			return err
		}
	}
}
