package mpiam

import (
	"fmt"
	"sync/atomic"

	"github.com/amgo-hpc/amgo/handlers"
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
// Ibarriers in flight at once. A Barrier on one rank and an Ibarrier on
// another match, as before.
//
// When a tool piggybacks values on messages (Piggybacker), barriers go over
// zero-byte point-to-point messages instead, which carry the values.

// maxBarrierRounds bounds the rounds of a barrier: ceil(log2 n) for n up to 2^40.
const maxBarrierRounds = 40

// barrierCounts counts the barrier messages this rank received on one
// communicator, by round. The handler adds; waiting callers read.
type barrierCounts struct {
	n [maxBarrierRounds]atomic.Uint64
}

// barrierCountsFor returns the counts of context ctx, creating them: a
// neighbour may enter a barrier on a communicator before this rank has
// finished creating it.
func (p *proc) barrierCountsFor(ctx uint32) *barrierCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.barrierCounts[ctx]
	if b == nil {
		if p.barrierCounts == nil {
			p.barrierCounts = map[uint32]*barrierCounts{}
		}
		b = new(barrierCounts)
		p.barrierCounts[ctx] = b
	}
	return b
}

// onBarrier counts a barrier message: a[0] is the communicator's context,
// a[1] the round.
func (p *proc) onBarrier(tok *handlers.Token, a []uint64, _ []byte) {
	if a[0] > 1<<32-1 || a[0]&1 != 0 || a[1] >= maxBarrierRounds {
		p.dropped(fmt.Errorf("barrier message from rank %d for context %d, round %d", tok.Source(), a[0], a[1]))
		return
	}
	p.barrierCountsFor(uint32(a[0])).n[a[1]].Add(1)
}

// barrierAM is the dissemination barrier of collective call x over active
// messages.
func (x coll) barrierAM() error {
	c := x.c
	p := c.p
	if c.size == 1 {
		return nil
	}
	bar := c.bar.Load()
	if bar == nil { // Ibarriers may get here concurrently: all store the same counts
		bar = p.barrierCountsFor(c.ctx)
		c.bar.Store(bar)
	}
	if err := p.collFailed(c); err != nil {
		return err
	}
	for r, dist := 0, 1; dist < c.size; r, dist = r+1, dist*2 {
		to := c.world((c.rank + dist) % c.size)
		if err := p.ep.RequestShort(to, hBarrier, uint64(c.ctx), uint64(r)); err != nil {
			return p.netErr(c, to, fmt.Sprintf("barrier on communicator %d", c.ctx), err)
		}
		n, want := &bar.n[r], x.epoch
		if err := p.waitColl(c, func() bool { return n.Load() > want }); err != nil {
			return err
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
