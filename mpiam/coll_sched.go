package mpiam

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/internal/locks"
	"github.com/amgo-hpc/amgo/mpiam/internal/sched"
)

// Nonblocking (MPI-4.1 §6.12) and persistent (§6.13) collectives run on the
// schedule engine (internal/sched): the call builds the operation's
// schedule, rounds of sends, receives and local reductions, and posts its
// first round; after that whatever polls (any MPI call that waits or tests,
// and the progress goroutine where there is one) advances it as its messages
// complete. No goroutine runs per operation. Completion is published in the
// order the operations were started on each communicator.

// nbc is one nonblocking or persistent collective operation: its schedule,
// the run under way, and the message posted for each step.
type nbc struct {
	x           coll
	call        Call
	peer, bytes int
	s           *sched.Schedule
	run         sched.Run
	msgs        []*reqState // by step index: the message posted for it, kept for reuse
	req         *reqState   // the user's request
	h           Request     // and its handle
	id          uint64      // collBegin's id
	key         schedKey    // the arguments a one-shot schedule was built for (zero: not cached)
	queued      atomic.Bool // on the engine's ready list
	finished    bool        // the run has ended (engine.mu)
	fenced      bool        // waits for direct collectives started before it (shmColl.fence; engine.mu)
	until       bool        // the schedule waits on conditions (barrier counts)
	persistent  bool
	pb          collPB // piggyback bookkeeping when a tool attaches values
}

// nbcEngine is a rank's collective schedules under way.
type nbcEngine struct {
	mu locks.Mutex // held while advancing schedules; guards nbc.finished, until, Comm.nbcq (a flag at single-threaded levels)

	readyMu locks.Mutex // a leaf lock: guards ready alone (a flag at single-threaded levels)
	ready   []*nbc      // schedules with a step that completed since they were last advanced
	batch   []*nbc      // ready's spare array
	pending atomic.Bool

	until  []*nbc // schedules waiting on a condition: advanced at every poll
	nUntil atomic.Int32

	areas  []*shmColl // shared areas with nonblocking collectives queued (coll_shm_nb.go): driven at every poll
	nAreas atomic.Int32
}

// stepDone is every posted step's completion callback: it queues the
// step's operation to be advanced. Handlers call it with proc.mu held, so
// it takes only the leaf lock.
func stepDone(r *reqState) {
	n := r.coll
	if n.queued.Swap(true) {
		return
	}
	e := &n.x.c.p.nbc
	e.readyMu.Lock()
	e.ready = append(e.ready, n)
	e.readyMu.Unlock()
	e.pending.Store(true)
}

// Post starts step i, a send or receive on the collective context, or the
// shared area's event (coll_shm_nb.go).
func (n *nbc) Post(i int, op *sched.Op) error {
	if op.Kind == sched.EventOp {
		op.Ext.(*shmNBOp).post(n) // the only events: the shared area's
		return nil
	}
	r := n.msgs[i]
	if r == nil {
		r, _ = n.x.c.p.states.get(false)
		n.msgs[i] = r
	} else {
		r.reset()
	}
	cc := n.x.cc
	r.p, r.comm, r.peer, r.tag, r.buf, r.onDone, r.coll = cc.p, cc, op.Peer, n.x.tag+op.Tag, op.Buf, stepDone, n
	if op.Ext != nil {
		r.lay = op.Ext.(*layout) // non-contiguous data (coll_typed.go)
	}
	if op.Kind == sched.SendOp {
		r.kind, r.mode = kindSend, Standard
		if n.x.pb != nil {
			r.useCold()
			r.pbOut, r.hasPBOut = n.x.outgoing()
		}
		if op.Exchange && r.lay == nil && cc.p.exchangeRndv(cc.world(op.Peer), len(op.Buf), cc.p.exchangeLimit(op.Blocks)) {
			r.useCold()
			r.rndv = true // as a blocking exchange step's (eagerStep)
		}
		return cc.p.startSend(r)
	}
	r.kind = kindRecv
	return cc.p.startRecv(r)
}

// Test reports whether step i has completed.
func (n *nbc) Test(i int, op *sched.Op) (bool, error) {
	if op.Kind == sched.UntilOp {
		if op.Cond() {
			return true, nil
		}
		return false, n.x.c.p.collFailed(n.x.c)
	}
	if op.Kind == sched.EventOp {
		o := op.Ext.(*shmNBOp)
		if o.done {
			return true, nil
		}
		err := n.x.c.p.collFailed(n.x.c) // a dead rank never publishes
		if err != nil {
			o.abandon()
		}
		return false, err
	}
	r := n.msgs[i]
	if !r.done.Load() {
		return false, nil
	}
	st := r.status
	if st.Err != nil {
		return true, st.Err
	}
	if op.Kind == sched.RecvOp {
		n.x.observe(st)
		if want := r.size(); st.Bytes != want {
			return true, fmt.Errorf("%w: collective step expected %d bytes from rank %d, got %d (arguments differ across ranks?)", ErrTruncate, want, op.Peer, st.Bytes)
		}
	}
	return true, nil
}

// Cancel withdraws a posted receive after a failure; a send cannot be
// withdrawn and completes on its own.
func (n *nbc) Cancel(i int, op *sched.Op) {
	if op.Kind == sched.EventOp {
		op.Ext.(*shmNBOp).abandon()
		return
	}
	if r := n.msgs[i]; r != nil && op.Kind == sched.RecvOp {
		_ = r.cancel()
	}
}

// newNBC makes the operation for schedule s (nil: set later) of
// collective call x on c, with its user request (kind coll, not started).
func newNBC(x coll, call Call, peer, bytes int, s *sched.Schedule) *nbc {
	n := &nbc{x: x, call: call, peer: peer, bytes: bytes}
	if x.pb != nil {
		n.x.pb = &n.pb
	}
	n.newReq()
	if s != nil {
		n.setSchedule(s)
	}
	return n
}

// newReq gives n a user request (kind coll, not started) and its handle,
// from the rank's cache of operation states.
func (n *nbc) newReq() {
	c := n.x.c
	n.req, n.h = c.p.states.get(true)
	r := n.req
	r.p, r.kind, r.comm, r.peer, r.tag, r.coll = c.p, kindColl, c, AnySource, AnyTag, n
}

// setSchedule gives n its schedule.
func (n *nbc) setSchedule(s *sched.Schedule) {
	n.s, n.msgs = s, make([]*reqState, len(s.Ops()))
	for _, op := range s.Ops() {
		if op.Kind == sched.UntilOp {
			n.until = true
			break
		}
	}
}

// begin starts a run of n: it joins c's queue of collectives under way and
// takes its first steps.
func (n *nbc) begin() {
	c := n.x.c
	p := c.p
	n.req.done.Store(false)
	n.req.status = Status{}
	n.pb = collPB{}
	n.finished = false
	n.run.Reset(n.s)
	n.id = p.collBegin(n.call, c, n.peer, n.bytes)
	e := &p.nbc
	e.mu.Lock()
	c.nbcq = append(c.nbcq, n)
	if n.until {
		e.until = append(e.until, n)
		e.nUntil.Add(1)
	}
	if a := c.readyArea(); a != nil && a.nb.direct > 0 {
		n.fenced = true
		a.fence(n)
	} else {
		n.advanceLocked()
	}
	e.mu.Unlock()
	p.progressColls() // what completed meanwhile, with the lock free
}

// advanceLocked advances n's run and, when it has ended, publishes the
// completions that were waiting for it in c's order. e.mu held.
func (n *nbc) advanceLocked() {
	if n.finished || n.fenced {
		return
	}
	done, _ := n.run.Progress(n)
	if !done {
		return
	}
	n.finished = true
	c := n.x.c
	e := &c.p.nbc
	if n.until {
		for i, u := range e.until {
			if u == n {
				e.until = append(e.until[:i], e.until[i+1:]...)
				e.nUntil.Add(-1)
				break
			}
		}
	}
	q := c.nbcq[c.nbcHead:]
	k := 0
	for k < len(q) && q[k].finished {
		q[k].publish()
		q[k] = nil
		k++
	}
	if c.nbcHead += k; c.nbcHead == len(c.nbcq) {
		c.nbcq, c.nbcHead = c.nbcq[:0], 0 // drained: the array is reused
	}
}

// publish completes n's user request. The step states of a one-shot
// operation go back to the cache once complete (a cancelled receive that
// the network still holds is left to the garbage collector).
func (n *nbc) publish() {
	p := n.x.c.p
	_, err := n.run.Finished()
	p.collEnd(n.id)
	req := n.req
	if !n.persistent {
		if err == nil && n.key.call != 0 {
			n.x.c.cacheSchedLocked(n)
		} else {
			for i, r := range n.msgs {
				if r != nil && r.done.Load() {
					p.states.put(r)
				}
				n.msgs[i] = nil
			}
		}
		n.req, n.h = nil, Request{}
	}
	req.complete(n.x.status(err))
}

// schedKey identifies the arguments of a one-shot collective call whose
// schedule can serve a later call with the same ones: libNBC's schedule
// cache (Hoefler, Lumsdaine and Rehm, SC 2007). Programs that call
// Iallreduce on the same buffers in a loop build its schedule once.
type schedKey struct {
	call       Call
	send, recv unsafe.Pointer // the buffers' first bytes
	ns, nr     int            // their lengths in bytes
	root       int
	op         unsafe.Pointer // the operation's function (nil: none)
	commute    bool
	elem       int
	area       bool // the communicator's shared area existed (coll_shm_nb.go)
}

// onArea is k for a call that may go through c's shared area: whether it
// exists is part of the key, so that a schedule built before it did is not
// reused after (the choice must be every rank's alike; a kept schedule is
// not).
func (k schedKey) onArea(c *Comm) schedKey {
	k.area = c.readyArea() != nil
	return k
}

// keyOf is the cache key of call on buffers send and recv of T with op
// (nil: none) and root.
func keyOf[T any](call Call, send, recv []T, op *Op[T], root int) schedKey {
	var z T
	k := schedKey{call: call, root: root, elem: int(unsafe.Sizeof(z)), ns: len(send), nr: len(recv)}
	k.send, k.recv = unsafe.Pointer(unsafe.SliceData(send)), unsafe.Pointer(unsafe.SliceData(recv))
	if send == nil {
		k.ns = -1
	}
	if op != nil {
		// A function value points to its code and captured variables: the
		// same pointer is the same operation. A predefined operation's value
		// is made anew by each Sum[T]() call (it captures the type's
		// dictionary), so its code address identifies it.
		fv := *(*unsafe.Pointer)(unsafe.Pointer(&op.Fn))
		k.op, k.commute = fv, op.Commutative
		if op.predefined && fv != nil {
			k.op = *(*unsafe.Pointer)(fv)
		}
	}
	return k
}

// schedCacheSize is how many finished one-shot schedules a communicator
// keeps for reuse.
const schedCacheSize = 4

// cacheSchedLocked keeps finished operation n for a later call with the
// same arguments, in place of the oldest kept one. p.nbc.mu held.
func (c *Comm) cacheSchedLocked(n *nbc) {
	c.schedCache[c.schedNext] = n
	c.schedNext = (c.schedNext + 1) % schedCacheSize
}

// cachedSched takes a kept operation built for key out of c's cache.
func (c *Comm) cachedSched(key schedKey) *nbc {
	e := &c.p.nbc
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, n := range c.schedCache {
		if n != nil && n.key == key {
			c.schedCache[i] = nil
			return n
		}
	}
	return nil
}

// progressColls advances the schedules whose steps completed, and those
// waiting on conditions. Any polling call runs it (runDeferred); one
// goroutine at a time does the work, the others go on polling.
func (p *proc) progressColls() {
	e := &p.nbc
	for e.pending.Load() || e.nUntil.Load() > 0 || e.nAreas.Load() > 0 {
		if !e.mu.TryLock() {
			return
		}
		for _, n := range e.until {
			n.advanceLocked()
		}
		yield := false
		for i := 0; i < len(e.areas); {
			empty, y := e.areas[i].progressNB(p)
			yield = yield || y
			if empty {
				a := e.areas[i]
				a.nb.queued = false
				last := len(e.areas) - 1
				e.areas[i], e.areas[last] = e.areas[last], nil
				e.areas = e.areas[:last]
				e.nAreas.Add(-1)
				continue
			}
			i++
		}
		for e.pending.Load() {
			e.readyMu.Lock()
			b := e.ready
			e.ready, e.batch = e.batch[:0], nil
			e.pending.Store(false)
			e.readyMu.Unlock()
			for i, n := range b {
				n.queued.Store(false)
				n.advanceLocked()
				b[i] = nil
			}
			e.readyMu.Lock()
			if e.batch == nil {
				e.batch = b[:0]
			}
			e.readyMu.Unlock()
		}
		e.mu.Unlock()
		if yield {
			runtime.Gosched()
		}
		if !e.pending.Load() {
			return // waiting conditions were looked at once: the next poll looks again
		}
	}
}

// startSched starts collective call on c as a schedule built by build, and
// returns its request; build's error (bad arguments) is returned at once.
func (c *Comm) startSched(call Call, peer, bytes int, build func(x coll, b *sched.Builder) error) (Request, error) {
	return c.startSchedKey(schedKey{}, call, peer, bytes, build, sigCheck{})
}

// startSchedKey is startSched for a call whose schedule may come from c's
// cache (key's call set): a kept operation built for the same arguments runs
// again on the call's new tag base.
func (c *Comm) startSchedKey(key schedKey, call Call, peer, bytes int, build func(x coll, b *sched.Builder) error, chk sigCheck) (Request, error) {
	if c.hooked() {
		return c.p.hookReq(&Event{Call: call, Comm: c, Peer: peer, Bytes: bytes}, func() (Request, error) {
			return c.startSchedUnhooked(key, call, peer, bytes, build, chk)
		})
	}
	return c.startSchedUnhooked(key, call, peer, bytes, build, chk)
}

// startSchedUnhooked is startSchedKey without the tools' hooks. It only
// calls build, so a caller that calls it directly when c has no tools
// keeps its builder's closure on its stack: a call served from the cache
// then allocates nothing for it.
func (c *Comm) startSchedUnhooked(key schedKey, call Call, peer, bytes int, build func(x coll, b *sched.Builder) error, chk sigCheck) (Request, error) {
	x, err := c.startColl(call, true)
	if err != nil {
		return Request{}, err
	}
	if key.call != 0 && x.pb == nil {
		if n := c.cachedSched(key); n != nil {
			n.x = x
			n.newReq()
			h := n.h
			n.begin()
			return h, nil
		}
	}
	var b sched.Builder
	chk.add(x, &b)
	if err := build(x, &b); err != nil {
		return Request{}, err
	}
	n := newNBC(x, call, peer, bytes, b.Schedule())
	if x.pb == nil {
		n.key = key
	}
	h := n.h
	n.begin()
	return h, nil
}

// runSched runs collective call on c as a schedule to completion: the
// blocking calls that have no algorithm of their own (ReduceScatter).
func (c *Comm) runSched(call Call, peer, bytes int, build func(x coll, b *sched.Builder) error) error {
	do := func() error {
		x, err := c.startColl(call, true)
		if err != nil {
			return err
		}
		var b sched.Builder
		if err := build(x, &b); err != nil {
			return err
		}
		n := newNBC(x, call, peer, bytes, b.Schedule())
		h := n.h
		n.begin()
		_, err = h.wait()
		return err
	}
	if c.hooked() {
		return c.p.hookErr(&Event{Call: call, Comm: c, Peer: peer, Bytes: bytes}, do)
	}
	return do()
}

// initSched makes a persistent collective request (MPI-4.1 §6.13): the
// schedule is built once, here, on a tag base of its own, and every Start
// runs it again.
func (c *Comm) initSched(call Call, peer, bytes int, build func(x coll, b *sched.Builder) error) (Request, error) {
	x, err := c.startColl(call, true)
	if err != nil {
		return Request{}, err
	}
	var b sched.Builder
	if err := build(x, &b); err != nil {
		return Request{}, err
	}
	n := newNBC(x, call, peer, bytes, b.Schedule())
	n.persistent = true
	n.req.persistent = true
	return n.h, nil
}

// startPersistent starts persistent collective request r again.
func (n *nbc) startPersistent() error {
	if n.call == CallBarrierInit {
		n.x.epoch = n.x.c.barriers.Add(1) - 1
		n.x.tag = n.barrierTag()
	}
	n.begin()
	return nil
}

// reduction wraps op as a reduction on packed elements of T.
func reduction[T any](op Op[T]) *sched.Reduction {
	var z T
	es := int(unsafe.Sizeof(z))
	return &sched.Reduction{
		Commutative: op.Commutative,
		Elem:        max(es, 1),
		Fn:          func(in, inout []byte) { op.Fn(fromRaw[T](in), fromRaw[T](inout)) },
	}
}

// fromRaw is raw's inverse: the elements of T in b (aligned for T).
func fromRaw[T any](b []byte) []T {
	var z T
	es := int(unsafe.Sizeof(z))
	if len(b) == 0 || es == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/es)
}

// group is the schedule engine's view of x's ranks.
func (x coll) group() sched.Group {
	if x.v == nil {
		return sched.Flat(x.c.rank, x.c.size)
	}
	return sched.Group{Ranks: x.v.ranks, Me: x.v.me, Size: len(x.v.ranks)}
}

// elemCounts converts counts and displacements in elements of T to bytes.
func elemCounts[T any](counts, displs []int) (bc, bd []int) {
	var z T
	es := int(unsafe.Sizeof(z))
	bc, bd = make([]int, len(counts)), make([]int, len(displs))
	for i := range counts {
		bc[i] = counts[i] * es
	}
	for i := range displs {
		bd[i] = displs[i] * es
	}
	return bc, bd
}
