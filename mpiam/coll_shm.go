package mpiam

import (
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/handlers"
)

// Collectives through a node's shared memory.
//
// When every rank of a communicator runs on one node, its blocking Barrier,
// and its Bcast, Allreduce and Alltoall of at most shmCollSlot bytes (per
// rank), need no message:
// the ranks meet in a mapping they share, as Open MPI's coll/sm and MPICH's
// shared-memory collectives do (Graham and Shipman, "MPI support for
// multi-core architectures: optimized shared memory collectives", EuroPVM/MPI
// 2008). Each rank owns a control line (64 bytes, written by it alone) and
// shmSlots data slots, each a stamp word followed by the data in the same
// cache line (and the lines after it), so that a rank waiting for another's
// data pulls one line for up to 56 bytes. The k-th such collective on the
// communicator (k = 1, 2, ..., the same on every rank since collectives are
// called in the same order) uses slot k%shmSlots and these rules:
//
//   - a rank writes its slot k%shmSlots only once every rank has finished
//     collective k-shmSlots, reading what that slot held: its done ≥
//     k-shmSlots, or its ready > k-shmSlots (the rank remembers the least
//     it saw, and reads the lines again only when that is not enough: a
//     root that runs ahead reads them once every few calls);
//   - a rank that writes data sets its slot's stamp to k after the data,
//     and Bcast, Allreduce and Alltoall finish with done = k (the rank has
//     read what it needed); Barrier publishes ready = k, which says as much
//     for every collective before k, and sets no done;
//   - Barrier waits until every ready ≥ k; Allreduce until every slot's
//     stamp is k, then reduces all the slots in rank order, so every rank
//     computes the same bits; Bcast's non-roots wait for the root's stamp
//     and copy its slot; Alltoall publishes a rank's whole send buffer and,
//     once every slot's stamp is k, copies its block of each.
//
// A rank that has waited long (past shmSpin checks) sets its line's sleep
// word, counts itself in the area's sleepers word, and waits in the
// endpoint, which may sleep on the network's wake-up; a rank that publishes
// reads the sleepers word (a line that changes only then, so the load stays
// in its cache) and, when it is not zero, wakes the ranks whose sleep word
// is set with a short request (mpi.coll.wake), whose handler does nothing:
// its arrival is the wake-up.
//
// A tool's piggybacked value (Piggybacker) goes in the publisher's line,
// stamped with the collective's number; a rank that heard from another in
// that collective (every rank, in Barrier and Allreduce; the root, in Bcast)
// observes it as it would a message's.
//
// The choice is made once per communicator, at its first collective that
// could use it, by every rank alike: AMGO_COLL_SHM=0 turns it off, and a
// communicator of more than shmCollMax ranks or across nodes never uses it.
// Blocking collectives do not match nonblocking ones (MPI-4.1 §6.12): the
// nonblocking Ibcast, Iallreduce and Ialltoall that use the area do so in a
// section of their own (coll_shm_nb.go), and Ibarrier keeps its messages.

// EnvCollShm turns the shared-memory collectives off when "0".
const EnvCollShm = "AMGO_COLL_SHM"

const (
	shmCollMax  = 8                // ranks: beyond, the message algorithms (flat waits read every rank's line)
	shmCollSlot = 4096             // bytes per rank per slot: the largest Bcast, Allreduce or Alltoall (whole buffer) that goes through it
	shmStride   = 64 + shmCollSlot // a slot: its stamp (8 bytes), its data, padding to whole lines
	shmSlots    = 32               // data slots per rank, used in turn: the depth a Bcast's root runs ahead
	shmSpin     = 2000             // checks of the condition before a wait polls the network and may sleep
)

// States of Comm.shmState.
const (
	shmUntried int32 = iota
	shmCreating
	shmReady
	shmNone
)

// shmCtl is a rank's control line.
type shmCtl struct {
	ready atomic.Uint64    // the last collective this rank has published in
	done  atomic.Uint64    // the last collective this rank has finished reading in
	sleep atomic.Uint64    // nonzero: this rank may sleep in the endpoint; wake it with a message (a count of its waits that may)
	pbk   [2]atomic.Uint64 // by collective parity: the collective pbv holds the value of (0 while it changes)
	pbv   [2]atomic.Uint64 // by collective parity: this rank's outgoing tool value
	_     [8]byte
}

// shmColl is a communicator's shared area at this rank.
type shmColl struct {
	sh       sharedWin
	n, me    int
	seq      uint64 // shared-memory collectives this rank has started on the communicator
	minDone  uint64 // the least done this rank saw last time it read every line
	ctl      []*shmCtl
	sleepers *atomic.Int64 // ranks that set their sleep word, in a line of its own
	slots    [][shmSlots]shmSlot
	world    []int // world rank of each rank of the communicator
	nb       shmNB // the nonblocking section
}

// shmSlot is one data slot of a rank: its stamp (the collective its data
// is of; set after the data) and its data, which begins in the stamp's line.
type shmSlot struct {
	stamp *atomic.Uint64
	data  []byte
}

// shmArea is c's shared area when its collectives may use it, else nil. The
// first call on c decides, collectively (every rank makes its first call at
// the same collective); the collectives it calls meanwhile see nil.
func (c *Comm) shmArea() *shmColl {
	switch c.shmState.Load() {
	case shmReady:
		return c.shmc
	case shmUntried:
	default:
		return nil
	}
	if c.size < 2 || c.size > shmCollMax || os.Getenv(EnvCollShm) == "0" {
		c.shmState.Store(shmNone)
		return nil
	}
	me := c.p.ep.Node(c.world(c.rank))
	for r := range c.size {
		if c.p.ep.Node(c.world(r)) != me {
			c.shmState.Store(shmNone)
			return nil
		}
	}
	c.shmState.Store(shmCreating)
	a := newShmColl(c)
	if a == nil {
		c.shmState.Store(shmNone)
		return nil
	}
	c.shmc = a
	c.shmState.Store(shmReady)
	return a
}

// newShmColl maps c's shared area, collectively, or returns nil when it
// cannot be mapped (every rank alike).
func newShmColl(c *Comm) *shmColl {
	n := c.size
	a := &shmColl{n: n, me: c.rank, ctl: make([]*shmCtl, n), slots: make([][shmSlots]shmSlot, n), world: make([]int, n)}
	// The control lines, the sleepers' line, then each rank's slots; then
	// the nonblocking section (coll_shm_nb.go).
	blocking := 64*(n+1) + n*shmSlots*shmStride
	if err := a.sh.mapAll(c, blocking+nbSize(n)); err != nil {
		return nil
	}
	a.sleepers = (*atomic.Int64)(unsafe.Pointer(&a.sh.mem[64*n]))
	for r := range n {
		a.ctl[r] = (*shmCtl)(unsafe.Pointer(&a.sh.mem[64*r]))
		for s := range shmSlots {
			base := 64*(n+1) + (r*shmSlots+s)*shmStride
			a.slots[r][s] = shmSlot{
				stamp: (*atomic.Uint64)(unsafe.Pointer(&a.sh.mem[base])),
				data:  a.sh.mem[base+8 : base+8+shmCollSlot : base+8+shmCollSlot],
			}
		}
		a.world[r] = c.world(r)
	}
	a.initNB(blocking)
	return a
}

// free unmaps the area (Comm.Free), or leaves that to the last of the
// nonblocking collectives still under way in it.
func (a *shmColl) free(p *proc) {
	p.nbc.mu.Lock()
	defer p.nbc.mu.Unlock()
	if a.nb.head < len(a.nb.q) {
		a.nb.unmap = true
		return
	}
	a.sh.unmap()
}

// publish sets this rank's ready to k, with its tool value first, and wakes
// the ranks that may sleep.
func (a *shmColl) publish(x coll, k uint64) {
	a.toolValue(x, k)
	a.ctl[a.me].ready.Store(k)
	a.wake(x.c.p)
}

// publishSlot stamps this rank's slot of collective k (its data written),
// with its tool value first, sets done = k too when done (a rank that reads
// nothing in k), and wakes the ranks that may sleep.
func (a *shmColl) publishSlot(x coll, k uint64, done bool) {
	a.toolValue(x, k)
	a.slots[a.me][k%shmSlots].stamp.Store(k)
	if done {
		a.ctl[a.me].done.Store(k)
	}
	a.wake(x.c.p)
}

// toolValue puts this rank's outgoing tool value of collective k in its
// line, when a tool piggybacks values.
func (a *shmColl) toolValue(x coll, k uint64) {
	if x.pb == nil {
		return
	}
	l := a.ctl[a.me]
	v, _ := x.outgoing()
	l.pbk[k%2].Store(0)
	l.pbv[k%2].Store(v)
	l.pbk[k%2].Store(k)
}

// heard observes rank r's tool value of collective k, if it has one.
func (a *shmColl) heard(x coll, r int, k uint64) {
	if x.pb == nil || r == a.me {
		return
	}
	l := a.ctl[r]
	if l.pbk[k%2].Load() != k {
		return // none, or rewritten by a later collective: lost
	}
	v := l.pbv[k%2].Load()
	if l.pbk[k%2].Load() == k { // not rewritten meanwhile
		x.observe(Status{Piggyback: v, HasPiggyback: true})
	}
}

// finish sets this rank's done to k and wakes the ranks that may sleep.
func (a *shmColl) finish(p *proc, k uint64) {
	a.ctl[a.me].done.Store(k)
	a.wake(p)
}

// wake sends mpi.coll.wake to every rank whose sleep word is set: it may be
// asleep in its endpoint while what it waits for has changed.
func (a *shmColl) wake(p *proc) {
	if a.sleepers.Load() == 0 {
		return
	}
	for r, l := range a.ctl {
		if r != a.me && l.sleep.Load() != 0 {
			_ = p.ep.RequestShort(a.world[r], hCollWake) // a dead rank's failure shows in the waits
		}
	}
}

// wait returns once cond holds: it checks shmSpin times, then waits in the
// endpoint (polling, and sleeping on the network's wake-up after the spin
// time) with the sleep word set. Errors: ErrProcFailed (a rank of c failed
// during the wait; the collectives check before they start).
func (a *shmColl) wait(p *proc, c *Comm, cond func() bool) error {
	for i := range shmSpin {
		if cond() {
			return nil
		}
		p.ep.Relax() // an oversubscribed node: the rank awaited may need this processor
		if i%256 == 255 {
			runtime.Gosched() // ranks as goroutines: the one awaited may need this processor
		}
	}
	l := a.ctl[a.me]
	l.sleep.Add(1)
	a.sleepers.Add(1)
	err := p.waitColl(c, cond)
	a.sleepers.Add(-1)
	l.sleep.Add(^uint64(0))
	return err
}

// allReady reports whether every rank's ready is at least k.
func (a *shmColl) allReady(k uint64) bool {
	for _, l := range a.ctl {
		if l.ready.Load() < k {
			return false
		}
	}
	return true
}

// allStamped reports whether every rank's slot of collective k holds its data.
func (a *shmColl) allStamped(k uint64) bool {
	s := k % shmSlots
	for r := range a.slots {
		if a.slots[r][s].stamp.Load() < k {
			return false
		}
	}
	return true
}

// slot waits until this rank's slot of collective k may be written (every
// rank has finished collective k-shmSlots, the slot's last use) and returns
// it.
func (a *shmColl) slot(p *proc, c *Comm, k uint64) ([]byte, error) {
	s := a.slots[a.me][k%shmSlots].data
	if k <= shmSlots || a.minDone >= k-shmSlots {
		return s, nil
	}
	// A rank has finished reading collective j once its done ≥ j, or once
	// it has entered a Barrier after j (ready ≥ j+1): Barrier sets no done.
	least := func() uint64 {
		m := uint64(math.MaxUint64)
		for _, l := range a.ctl {
			d := l.done.Load()
			if r := l.ready.Load(); r > d+1 {
				d = r - 1
			}
			m = min(m, d)
		}
		return m
	}
	err := a.wait(p, c, func() bool {
		a.minDone = least()
		return a.minDone >= k-shmSlots
	})
	return s, err
}

// heardAll observes every other rank's tool value of collective k.
func (a *shmColl) heardAll(x coll, k uint64) {
	if x.pb == nil {
		return
	}
	for r := range a.n {
		a.heard(x, r, k)
	}
}

// barrier is Barrier through the area.
func (a *shmColl) barrier(x coll) error {
	p, c := x.c.p, x.c
	if err := p.collFailed(c); err != nil {
		return err // a dead rank never publishes: fail as the message algorithms do
	}
	a.seq++
	k := a.seq
	a.publish(x, k)
	err := a.wait(p, c, func() bool { return a.allReady(k) })
	a.heardAll(x, k)
	// No done: ready = k already says this rank finished every collective
	// before k (see slot), and a store to the line the others have just
	// read would wait for their copies to be invalidated.
	return err
}

// bcast is Bcast of b (at most shmCollSlot bytes) through the area.
func (a *shmColl) bcast(x coll, b []byte, root int) error {
	p, c := x.c.p, x.c
	if err := p.collFailed(c); err != nil {
		return err // a dead rank never publishes: fail as the message algorithms do
	}
	a.seq++
	k := a.seq
	if a.me == root {
		s, err := a.slot(p, c, k)
		if err != nil {
			return err
		}
		copy(s, b)
		a.publishSlot(x, k, true) // the root reads nothing: done at once
		return nil
	}
	rs := a.slots[root][k%shmSlots]
	if err := a.wait(p, c, func() bool { return rs.stamp.Load() >= k }); err != nil {
		return err
	}
	copy(b, rs.data)
	a.heard(x, root, k)
	a.finish(p, k)
	return nil
}

// publishAll is the first half of a collective in which every rank
// publishes b in its slot and reads every rank's: it takes the
// collective's number k, publishes b, waits until every slot's stamp is k
// and observes the ranks' tool values. The caller reads slot k%shmSlots of
// each rank, then calls finish(k).
func (a *shmColl) publishAll(x coll, b []byte) (uint64, error) {
	p, c := x.c.p, x.c
	if err := p.collFailed(c); err != nil {
		return 0, err // a dead rank never publishes: fail as the message algorithms do
	}
	a.seq++
	k := a.seq
	mine, err := a.slot(p, c, k)
	if err != nil {
		return 0, err
	}
	copy(mine, b)
	a.publishSlot(x, k, false)
	if err := a.wait(p, c, func() bool { return a.allStamped(k) }); err != nil {
		return 0, err
	}
	a.heardAll(x, k)
	return k, nil
}

// shmAllreduce is Allreduce of send into recv (at most shmCollSlot bytes)
// through the area: every rank reduces every slot, in rank order.
func shmAllreduce[T any](a *shmColl, x coll, send, recv []T, op Op[T]) error {
	k, err := a.publishAll(x, raw(send))
	if err != nil {
		return err
	}
	s, n := k%shmSlots, len(raw(send))
	copy(raw(recv), a.slots[a.n-1][s].data[:n])
	for r := a.n - 2; r >= 0; r-- {
		op.Fn(fromRaw[T](a.slots[r][s].data[:n]), recv) // recv = x_r ∘ recv: x_0 ∘ (x_1 ∘ (... ∘ x_(n-1)))
	}
	a.finish(x.c.p, k)
	return nil
}

// shmAlltoall is Alltoall of send into recv (n equal blocks, at most
// shmCollSlot bytes in all) through the area: every rank publishes its whole
// send buffer in its slot, then takes its block of every rank's. A nil send
// means in place: recv is published before it is written.
func shmAlltoall[T any](a *shmColl, x coll, send, recv []T) error {
	rb, sb := raw(recv), raw(send)
	if send == nil {
		sb = rb
	}
	blk := len(rb) / a.n
	k, err := a.publishAll(x, sb)
	if err != nil {
		return err
	}
	s, off := k%shmSlots, a.me*blk
	for r := range a.n {
		copy(rb[r*blk:(r+1)*blk], a.slots[r][s].data[off:off+blk])
	}
	a.finish(x.c.p, k)
	return nil
}

// onCollWake runs when a rank published in a shared area while this one
// may sleep: its arrival woke the endpoint, which is all it is for.
func (p *proc) onCollWake(*handlers.Token, []uint64, []byte) {}
