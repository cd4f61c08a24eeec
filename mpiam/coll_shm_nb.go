package mpiam

import (
	"encoding/binary"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/release"
	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// Nonblocking collectives through a node's shared memory.
//
// Once a communicator's shared area exists (its first blocking collective
// that could use it made it, coll_shm.go), Ibcast, Iallreduce and Ialltoall
// of at most shmCollSlot bytes per rank run through a section of the area of
// their own rather than as messages. Nonblocking collectives are ordered
// among themselves on every rank alike (MPI-4.1 §6.12), but not with the
// blocking ones, which may run while they are under way: hence a section of
// their own, with its own numbering. The j-th of them on the communicator
// (j = 1, 2, ...) uses slot j%shmSlots of each rank:
//
//   - a rank writes its slot j%shmSlots once every rank's nonblocking done
//     is at least j-shmSlots (every rank has finished reading collective
//     j-shmSlots);
//   - a rank stamps its slot with j after its data (and its tool value);
//   - a rank's done is the last collective it has finished reading: they
//     finish in order.
//
// Each call's schedule is two steps: number the collective and queue it on
// the section (a call), and an event step that completes when the section
// has finished it, which then advances the operation at once. The section drives its queue from the rank's progress
// (progressColls), in order, with two cursors: the first collective not yet
// published (it publishes once its slot is free) and the first not yet
// finished (it finishes once the slots it reads are stamped). Each stops at
// the first that cannot go on, so a poll costs the same with one or with
// ten thousand in flight. A section that has made no progress for shmSpin
// of its polls sets the rank's sleep word (a count, shared with the blocking
// waits) so that publishers wake it with a message, as the blocking waits
// do, and clears it when its queue is empty; until then it keeps the
// endpoint's waits polling (Endpoint.Expect), since nothing would wake them.
//
// Whether a call goes through the area is decided from the area's state at
// the call, which is the same on every rank since collectives are called in
// the same order; a schedule kept for reuse (schedKey) remembers it.
//
// A nonblocking slot holds its stamp, the collective number its tool value
// is of (0: none) and the value, then the data: the value is read before
// the slot can be reused, so none is lost however many are in flight.

// Offsets in a nonblocking slot.
const (
	nbPBK  = 8  // the collective the tool value is of
	nbPBV  = 16 // the tool value
	nbData = 24 // the data
)

// shmNB is the nonblocking section of a communicator's area at this rank.
// Its fields are used with the schedule engine's lock held (nbcEngine.mu).
type shmNB struct {
	done    []*atomic.Uint64 // by rank: the last nonblocking collective it has finished
	slots   [][shmSlots]shmSlot
	seq     uint64     // nonblocking collectives started here through the area
	minDone uint64     // the least done seen last time every rank's was read
	q       []*shmNBOp // collectives under way, in order
	pub     int        // q[pub] is the first not yet published
	head    int        // q[head] is the first not yet finished
	idle    int        // polls in a row that moved nothing
	slept   bool       // this section set the rank's sleep word
	queued  bool       // on the engine's list of sections to drive
	unmap   bool       // the communicator was freed meanwhile: unmap when q empties
	direct  int        // collectives in q started without a schedule (startAreaNB)
	spare   []*shmNBOp // finished ops of direct collectives and fences, for reuse
	red     areaRed    // the reduction a direct Iallreduce used last
}

// areaRed is the reduction of the last operation a direct Iallreduce used
// (startAreaNB), kept so that a loop of them wraps its operation once.
type areaRed struct {
	fn      unsafe.Pointer // the operation's function value
	commute bool
	elem    uintptr
	red     *sched.Reduction
}

// nbExpect is how long the endpoint's waits keep polling, from a poll
// that found the section's queue stuck, before they may sleep: longer than
// shmSpin polls take, after which the sleep word is set.
const nbExpect = 500 * time.Microsecond

// nbSize is the nonblocking section's bytes for n ranks: a done line per
// rank, then each rank's slots.
func nbSize(n int) int { return 64*n + n*shmSlots*shmStride }

// initNB lays the nonblocking section out from byte off of the mapping.
func (a *shmColl) initNB(off int) {
	n := a.n
	nb := &a.nb
	nb.done = make([]*atomic.Uint64, n)
	nb.slots = make([][shmSlots]shmSlot, n)
	for r := range n {
		nb.done[r] = (*atomic.Uint64)(unsafe.Pointer(&a.sh.mem[off+64*r]))
		for s := range shmSlots {
			base := off + 64*n + (r*shmSlots+s)*shmStride
			nb.slots[r][s] = shmSlot{
				stamp: (*atomic.Uint64)(unsafe.Pointer(&a.sh.mem[base])),
				data:  a.sh.mem[base : base+nbData+shmCollSlot : base+nbData+shmCollSlot],
			}
		}
	}
}

// shmNBArea is the area a nonblocking collective of n bytes per rank goes
// through when shm (a one-shot call) and x's communicator has one now; nil
// when it goes as messages.
func shmNBArea(x coll, shm bool, n int) *shmColl {
	if !shm || x.v != nil || x.size() < 2 || n > shmCollSlot {
		return nil
	}
	return x.c.readyArea()
}

// readyArea is c's area when it exists now, without making it (a
// nonblocking call must not wait for the other ranks); nil for a nil c.
func (c *Comm) readyArea() *shmColl {
	if c != nil && c.shmState.Load() == shmReady {
		return c.shmc
	}
	return nil
}

// Kinds of shmNBOp.
const (
	nbBcast uint8 = iota
	nbAllreduce
	nbAlltoall
	nbBarrier // publishes no data: every rank's stamp is the barrier
	nbFence   // no collective: finishes once those queued before it have, then advances n (fence)
)

// shmNBOp is one nonblocking collective through the section: what it
// publishes and reads, its number (taken when its schedule starts, in call
// order), and the event step that waits for it, or the request it
// completes when it was started directly (startAreaNB). A schedule kept
// for reuse keeps its op and numbers it anew.
type shmNBOp struct {
	a          *shmColl
	kind       uint8
	root       int    // nbBcast
	send, recv []byte // nbBcast: recv alone
	red        *sched.Reduction
	blk        int // nbAlltoall: bytes per rank
	k          uint64
	x          coll      // the operation's, for its tool values (set when posted)
	n          *nbc      // the operation, advanced when this finishes
	r          *reqState // a direct collective's request, completed when this finishes (n nil)
	c          *Comm     // the communicator, for its failed ranks
	done       bool      // finished: the event step has completed
	abandoned  bool      // the operation failed (a rank died): leave its buffers alone
}

// abandon marks o's operation as failed: should the section still finish
// it, it writes nothing into the buffers of a request already completed
// with an error. Engine lock held.
func (o *shmNBOp) abandon() { o.abandoned = true }

// start numbers the collective: the first step of its schedule, run at the
// call.
func (o *shmNBOp) start() error {
	o.a.nb.seq++
	o.k, o.done, o.abandoned = o.a.nb.seq, false, false
	return nil
}

// post queues o on its section as the event step of operation n, which
// is advanced when o finishes. Engine lock held.
func (o *shmNBOp) post(n *nbc) {
	o.x, o.n, o.c = n.x, n, n.x.c
	o.a.enqueue(o)
}

// enqueue appends o to a's queue and puts a on its rank's list of sections
// to drive. Engine lock held.
func (a *shmColl) enqueue(o *shmNBOp) {
	nb := &a.nb
	nb.q = append(nb.q, o)
	if !nb.queued {
		nb.queued = true
		e := &o.c.p.nbc
		e.areas = append(e.areas, a)
		e.nAreas.Add(1)
	}
}

// spareOp is an op of a's for a direct collective or a fence, from those
// finished before. Engine lock held.
func (a *shmColl) spareOp() *shmNBOp {
	nb := &a.nb
	if k := len(nb.spare); k > 0 {
		o := nb.spare[k-1]
		nb.spare[k-1] = nil
		nb.spare = nb.spare[:k-1]
		return o
	}
	return new(shmNBOp)
}

// fence queues on a a fence that advances n once the collectives queued
// before it have finished: a collective on the schedule engine that starts
// while direct ones are under way on its communicator completes after them
// (nonblocking collectives complete in the order they were started).
// Engine lock held.
func (a *shmColl) fence(n *nbc) {
	o := a.spareOp()
	*o = shmNBOp{a: a, kind: nbFence, k: a.nb.seq, n: n, c: n.x.c}
	a.enqueue(o)
}

// writes reports whether o writes this rank's slot.
func (o *shmNBOp) writes() bool {
	return o.kind != nbFence && (o.kind != nbBcast || o.a.me == o.root)
}

// slot is rank r's slot of o's collective.
func (o *shmNBOp) slot(r int) shmSlot { return o.a.nb.slots[r][o.k%shmSlots] }

// stamped reports whether rank r has published in o's collective.
func (o *shmNBOp) stamped(r int) bool { return o.slot(r).stamp.Load() >= o.k }

// readable reports whether what o reads is published.
func (o *shmNBOp) readable() bool {
	switch o.kind {
	case nbFence:
		return true
	case nbBcast:
		return o.a.me == o.root || o.stamped(o.root)
	}
	for r := range o.a.n {
		if !o.stamped(r) {
			return false
		}
	}
	return true
}

// slotFree reports whether this rank may write its slot of collective k.
func (nb *shmNB) slotFree(k uint64) bool {
	if k <= shmSlots || nb.minDone >= k-shmSlots {
		return true
	}
	m := uint64(math.MaxUint64)
	for _, d := range nb.done {
		m = min(m, d.Load())
	}
	nb.minDone = m
	return m >= k-shmSlots
}

// publish writes o's data into this rank's slot with its tool value and
// stamps it.
func (o *shmNBOp) publish() {
	s := o.slot(o.a.me)
	data := o.send
	if o.kind == nbBcast {
		data = o.recv
	}
	copy(s.data[nbData:], data)
	var pbk uint64
	if o.x.pb != nil {
		v, _ := o.x.outgoing()
		binary.LittleEndian.PutUint64(s.data[nbPBV:], v)
		pbk = o.k
	}
	binary.LittleEndian.PutUint64(s.data[nbPBK:], pbk)
	s.stamp.Store(o.k)
}

// data is n bytes at off of rank r's published data in o's collective.
func (o *shmNBOp) data(r, off, n int) []byte {
	return o.slot(r).data[nbData+off : nbData+off+n]
}

// heard observes rank r's tool value in o's collective, if it has one.
func (o *shmNBOp) heard(r int) {
	if o.x.pb == nil || r == o.a.me {
		return
	}
	d := o.slot(r).data
	if binary.LittleEndian.Uint64(d[nbPBK:]) == o.k {
		o.x.observe(Status{Piggyback: binary.LittleEndian.Uint64(d[nbPBV:]), HasPiggyback: true})
	}
}

// read takes o's results out of the slots: every rank reduces every slot in
// rank order (as the blocking Allreduce does, so every rank computes the
// same bits).
func (o *shmNBOp) read() {
	a := o.a
	switch o.kind {
	case nbBcast:
		if a.me != o.root {
			copy(o.recv, o.data(o.root, 0, len(o.recv)))
			o.heard(o.root)
		}
	case nbAllreduce:
		n := len(o.recv)
		copy(o.recv, o.data(a.n-1, 0, n))
		for r := a.n - 2; r >= 0; r-- {
			o.red.Fn(o.data(r, 0, n), o.recv) // recv = x_r ∘ recv
		}
		for r := range a.n {
			o.heard(r)
		}
	case nbAlltoall:
		for r := range a.n {
			copy(o.recv[r*o.blk:(r+1)*o.blk], o.data(r, a.me*o.blk, o.blk))
			o.heard(r)
		}
	case nbBarrier:
		for r := range a.n {
			o.heard(r)
		}
	}
}

// progressNB moves a's queue on as far as it can and reports whether its
// queue is now empty, and whether the caller should yield its processor
// (the queue has not moved for a while: with ranks as goroutines, the ranks
// it waits for may need it). Engine lock held.
func (a *shmColl) progressNB(p *proc) (empty, yield bool) {
	nb := &a.nb
	moved := a.driveNB(p)
	if !moved && nb.head < len(nb.q) {
		a.failNB(p)
	}
	if !moved && nb.head < len(nb.q) {
		nb.idle++
		yield = nb.idle%256 == 0
		if !nb.slept && nb.idle%256 == 64 {
			// Nothing wakes the endpoint for what the area's words say
			// until the sleep word is set: keep its waits from sleeping
			// before then (they would sleep out their whole timeout).
			p.ep.Expect(nbExpect)
		}
		if nb.idle >= shmSpin && !nb.slept {
			// Sleep word first, then look again: a publisher that did not
			// see it has published before it was set.
			nb.slept = true
			a.ctl[a.me].sleep.Add(1)
			a.sleepers.Add(1)
			a.driveNB(p)
		}
	}
	if nb.head < len(nb.q) {
		return false, yield
	}
	clear(nb.q)
	nb.q, nb.pub, nb.head, nb.idle = nb.q[:0], 0, 0, 0
	if nb.slept {
		nb.slept = false
		a.ctl[a.me].sleep.Add(^uint64(0))
		a.sleepers.Add(-1)
	}
	if nb.unmap {
		a.sh.unmap()
	}
	return true, false
}

// driveNB publishes and finishes what it can, in order, and reports whether
// it did anything.
func (a *shmColl) driveNB(p *proc) (moved bool) {
	nb := &a.nb
	for nb.pub < len(nb.q) {
		o := nb.q[nb.pub]
		if o.writes() {
			if !nb.slotFree(o.k) {
				break
			}
			o.publish()
			moved = true
		}
		nb.pub++
	}
	if moved {
		a.wake(p)
	}
	fin := false
	for nb.head < nb.pub {
		o := nb.q[nb.head]
		if !o.readable() {
			break
		}
		if !o.abandoned {
			o.read()
		}
		nb.done[a.me].Store(o.k)
		nb.q[nb.head] = nil
		nb.head++
		fin = true
		o.finish(nil)
	}
	if fin {
		nb.idle = 0
		a.wake(p)
	}
	return moved || fin
}

// finish ends o, read (err nil) or failed: it advances o's operation (an
// event step or a fence) or completes its direct request, and keeps a
// direct one's or a fence's op for reuse. o is off the queue. Engine lock
// held.
func (o *shmNBOp) finish(err error) {
	o.done = true
	if o.r == nil {
		if o.kind == nbFence {
			o.n.fenced = false
		}
		o.n.advanceLocked() // under the engine's lock, as the ready list's advances are
		if o.kind == nbFence {
			o.a.keepSpare(o)
		}
		return
	}
	r, a := o.r, o.a
	a.nb.direct--
	release.Store64(&r.p.directN, r.p.directN-1)
	a.keepSpare(o)
	r.complete(Status{Source: AnySource, Tag: AnyTag, Err: err})
}

// keepSpare keeps o, finished and off the queue, for reuse (spareOp).
func (a *shmColl) keepSpare(o *shmNBOp) {
	*o = shmNBOp{}
	if len(a.nb.spare) < shmSlots {
		a.nb.spare = append(a.nb.spare, o)
	}
}

// failNB fails every collective queued on a when a rank of their
// communicator has failed: a dead rank never publishes, and its waiters
// would wait forever. Their buffers are left alone (abandon). Engine lock
// held.
func (a *shmColl) failNB(p *proc) {
	nb := &a.nb
	if nb.head == len(nb.q) || !p.fail.any.Load() {
		return
	}
	err := p.collFailed(nb.q[nb.head].c)
	if err == nil {
		return
	}
	q := nb.q[nb.head:]
	nb.q, nb.pub, nb.head = nil, 0, 0 // a fence's operation may queue its event meanwhile
	for i, o := range q {
		q[i] = nil
		o.abandon()
		if o.r != nil || o.kind == nbFence {
			o.finish(err)
		} else {
			o.n.advanceLocked() // its event step's test reports the failure
		}
	}
}

// nbSched builds o's schedule: number it at the call, then wait for the
// section to finish it.
func nbSched(b *sched.Builder, o *shmNBOp) {
	b.Call(o.start)
	b.Event(o)
}

// shmIbcastSched builds Ibcast of buf through area a.
func shmIbcastSched(b *sched.Builder, a *shmColl, buf []byte, root int) {
	nbSched(b, &shmNBOp{a: a, kind: nbBcast, root: root, recv: buf})
}

// shmIallreduceSched builds Iallreduce of send into recv (the same length;
// send may be recv: it is published before recv is written) through area
// a.
func shmIallreduceSched(b *sched.Builder, a *shmColl, send, recv []byte, red *sched.Reduction) {
	nbSched(b, &shmNBOp{a: a, kind: nbAllreduce, send: send, recv: recv, red: red})
}

// shmIbarrierSched builds Ibarrier through area a: each rank stamps its
// slot, and the barrier is done once every rank's is stamped.
func shmIbarrierSched(b *sched.Builder, a *shmColl) {
	nbSched(b, &shmNBOp{a: a, kind: nbBarrier})
}

// shmIalltoallSched builds Ialltoall through area a: each rank publishes its
// whole send buffer (a.n blocks of blk bytes; it may be recv) and takes its
// block of everyone's.
func shmIalltoallSched(b *sched.Builder, a *shmColl, send, recv []byte, blk int) {
	nbSched(b, &shmNBOp{a: a, kind: nbAlltoall, send: send, recv: recv, blk: blk})
}

// directArea is the area through which a nonblocking collective of n bytes
// per rank on c goes directly (startAreaNB), nil when it goes on the
// schedule engine: c's area when it is ready and nothing needs the engine's
// call (a tool, piggybacked values, type checks, a failed rank).
func (c *Comm) directArea(n int) *shmColl {
	if n > shmCollSlot || !c.usable() || c.checking() || c.hooked() || c.p.pbTool != nil || c.p.fail.any.Load() {
		return nil
	}
	return c.readyArea()
}

// startAreaNB starts nonblocking collective o (its kind, root, buffers and
// block set) of call on c through area a directly: numbered and published
// in the call, finished by the section (driveNB), which completes its
// request; no schedule runs, which takes the engine's bookkeeping (most of
// ~2300 instructions per Iallreduce and Wait) out of the call. red, when not nil,
// gives the reduction with the engine's lock held (directRed). It reports
// false, having done nothing, when a collective on the schedule engine is
// under way on c: a later one must complete after it, which the engine's
// order of completions gives.
func (c *Comm) startAreaNB(a *shmColl, call Call, o shmNBOp, red func(a *shmColl) *sched.Reduction) (Request, bool) {
	p := c.p
	e := &p.nbc
	e.mu.Lock()
	if c.nbcHead != len(c.nbcq) {
		e.mu.Unlock()
		return Request{}, false
	}
	// Take the numbers every rank's call takes on either path (startColl):
	// whether a call goes directly differs between ranks.
	c.collSeq.Add(1)
	if call == CallIbarrier {
		c.barriers.Add(1)
	}
	r, h := p.states.get(true)
	r.p, r.kind, r.comm, r.peer, r.tag = p, kindColl, c, AnySource, AnyTag
	op := a.spareOp()
	*op = o
	op.a, op.r, op.c = a, r, c
	if red != nil {
		op.red = red(a)
	}
	_ = op.start()
	a.nb.direct++
	peer := AnySource
	if o.kind == nbBcast {
		peer = o.root
	}
	p.direct.begin(call, c.ctx, peer, len(o.recv))
	release.Store64(&p.directN, p.directN+1)
	a.enqueue(op)
	a.driveNB(p)
	e.mu.Unlock()
	return h, true
}

// directRed is the reduction of op for a direct Iallreduce through a: the
// one a's last used when op is the same operation, so that a loop of them
// wraps op once. Engine lock held.
func directRed[T any](a *shmColl, op *Op[T]) *sched.Reduction {
	var z T
	fn := *(*unsafe.Pointer)(unsafe.Pointer(&op.Fn))
	k := &a.nb.red
	if k.red == nil || k.fn != fn || k.commute != op.Commutative || k.elem != unsafe.Sizeof(z) {
		*k = areaRed{fn: fn, commute: op.Commutative, elem: unsafe.Sizeof(z), red: reduction(*op)}
	}
	return k.red
}
