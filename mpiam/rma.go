package mpiam

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"github.com/amgo-hpc/amgo/am"
	"github.com/amgo-hpc/amgo/am/transport"
	"github.com/amgo-hpc/amgo/handlers"
	"github.com/amgo-hpc/amgo/internal/memcopy"
)

// One-sided communication (MPI-4.1 chapter 12) over active messages, as
// SP AM's am_store and am_get were meant for: a Put is a store into the
// target's window (one copy over shared memory, fragments through the
// per-peer buffer elsewhere) whose handler acknowledges it; a Get is a
// single-copy read where the network has one, else a request that the
// target answers with a store into the origin's buffer; an Accumulate,
// FetchAndOp or CompareAndSwap is a medium request whose handler applies
// the operation to the window. Every operation is acknowledged, and the
// origin counts what each target has not acknowledged yet: Flush, Unlock
// and Fence wait for those counts only. Handlers at a target run one at a
// time, so accumulates to one location are atomic with respect to each
// other (§12.7). docs/mpi.md, "One-sided communication", has the protocol.

// LockType is the kind of a passive-target lock (MPI-4.1 §12.5.3); the
// values are MPICH's.
type LockType int

// Lock types.
const (
	LockExclusive LockType = 234 // MPI_LOCK_EXCLUSIVE: no other lock at the target at once
	LockShared    LockType = 235 // MPI_LOCK_SHARED: other shared locks may be held at once
)

// Assertions for Fence and Lock (MPI-4.1 §12.5.5), bits of an int; the values
// are MPICH's. amgo takes them as hints: ModeNocheck skips the lock's round
// trip (the program promises no conflicting lock), ModeNosucceed closes the
// access epoch; the others change nothing.
const (
	ModeNocheck   = 1024  // MPI_MODE_NOCHECK
	ModeNostore   = 2048  // MPI_MODE_NOSTORE
	ModeNoput     = 4096  // MPI_MODE_NOPUT
	ModeNoprecede = 8192  // MPI_MODE_NOPRECEDE
	ModeNosucceed = 16384 // MPI_MODE_NOSUCCEED
)

// modeAll is every assertion bit; others are ErrAssert.
const modeAll = ModeNocheck | ModeNostore | ModeNoput | ModeNoprecede | ModeNosucceed

// Status codes in an acknowledgement's second argument.
const (
	rmaOK       = iota
	rmaNoWin    // no such window at the target (freed, or never created there)
	rmaRange    // the range is outside the target's window
	rmaBadOp    // an accumulate's operation or element kind the target does not know
	rmaUnlocked // the acknowledgement of an Unlock: no operation is counted
)

// Win is a window: memory that every rank of a communicator exposes to the
// others' Put, Get and Accumulate (MPI_Win, MPI-4.1 §12.2). Make one with
// WinCreate or WinAllocate (collective), synchronize with Fence or
// Lock/Unlock, and release it with Free (collective).
//
// Passive-target operations (Lock ... Unlock) from another node progress at
// the target when it polls: while it is inside any MPI call, or always with
// a progress goroutine (AMGO_PROGRESS, docs/mpi.md); a target that computes
// for long without MPI calls delays them. Between ranks of one node sharing
// WinAllocate's mapping, the operations and an uncontended lock need
// nothing of the target (docs/rma.md).
type Win struct {
	p     *proc
	c     *Comm  // a duplicate of the creating communicator: the window's own context
	id    uint32 // c's context id: names the window in every one-sided message
	mem   []byte // this rank's window memory
	unit  int    // this rank's displacement unit, bytes
	seg   am.Segment
	addrs []uint64   // per rank of c: its window's address (am.Segment.Addr)
	sizes []int      // per rank: its window's size, bytes
	units []int      // per rank: its displacement unit, bytes
	keep  any        // the memory's owner (the user's slice), referenced for the window's life
	shm   *sharedWin // the node's mapping of the window's memory (nil: none)
	// local[r] is window rank r's memory when this rank can load and store
	// it directly (r on this node, in shm's mapping); nil: not so. Put and
	// Get to such a rank are copies.
	local        [][]byte
	lw           []*uint32 // per window rank in local: its lock words, accumulates' and passive target's (rma_shared.go)
	sharedFlavor bool      // made by WinAllocateShared

	// Dynamic windows (rma_dynamic.go): displacements are addresses,
	// checked by the target against the regions attached (under p.mu);
	// dynamic is set at creation.
	dynamic  bool
	attached []attachment

	// Origin side, under p.mu.
	pending  []int // per target: operations not acknowledged yet
	npending int
	rerr     error      // the first failure a target reported: the next synchronization returns it
	fence    bool       // a fence epoch is open (a Fence without ModeNosucceed)
	locks    []LockType // per target: the lock held (0: none)
	nlocks   int
	lockAll  bool
	granted  []bool            // per target: the lock request was granted
	nochk    []bool            // per target: the lock was asserted with ModeNocheck (no request went out)
	unlocked []bool            // per target: the unlock was acknowledged
	gets     map[uint64]*getOp // Gets and GetAccumulates under way, by cookie
	done     []am.Segment      // result buffers of finished ones, to unregister
	fetches  map[uint64][]byte // result of a FetchAndOp or CompareAndSwap, by cookie
	cookie   uint64
	freed    bool

	// Read without p.mu by the operations and Flush: tg[t] is what their
	// fast path needs of target t, settled that nothing is outstanding
	// (settleLocked, under p.mu).
	tg      []winTarget
	settled atomic.Bool

	// Generalized active target (rma_pscw.go), under p.mu.
	startGrp  []bool // per target: in the group of the access epoch Start opened
	startOpen bool
	posted    []int  // per target: Post notices arrived and not yet taken by a Start
	postGrp   []bool // per origin: in the group of the exposure epoch Post opened
	postOpen  bool
	complete  []int // per origin: Complete notices arrived and not yet taken by a Wait

	// Target side, under p.mu.
	shared  int  // shared locks held
	excl    bool // the exclusive lock is held
	waiters []lockWaiter
}

// getOp is a Get or GetAccumulate whose data a target stores into the
// origin's registered buffer: the buffer, the stores still to come, and the
// request to complete with the last (nil: none).
type getOp struct {
	seg   am.Segment
	parts int
	req   *reqState
	err   error
	then  func() // run when the data has landed, before req completes (nil: nothing)
}

// winTarget is one target of a window as the operations' fast path sees it,
// in one place: one bounds check, one cache line.
type winTarget struct {
	local []byte        // its memory when local (Win.local), else nil; set at creation
	unit  uint64        // its displacement unit, bytes; set at creation
	epoch atomic.Uint32 // ep* bits (epochLocked, under p.mu)
}

// Bits of winTarget.epoch.
const (
	epAccess  = 1 << iota // an access epoch to the target is open
	epPassive             // a passive-target one: Lock or LockAll
)

// epochLocked recomputes target's epoch bits from the origin-side state
// (none once the window is freed). p.mu held.
func (w *Win) epochLocked(target int) {
	var e uint32
	switch {
	case w.freed:
	case w.locks[target] != 0 || w.lockAll:
		e = epAccess | epPassive
	case w.fence || w.startGrp[target]:
		e = epAccess
	}
	w.tg[target].epoch.Store(e)
}

// epochsLocked is epochLocked for every target. p.mu held.
func (w *Win) epochsLocked() {
	for t := range w.tg {
		w.epochLocked(t)
	}
}

// settleLocked records whether anything is outstanding: an operation not
// acknowledged, a failure not returned, a result buffer not unregistered.
// Call it after changing any of those. p.mu held.
func (w *Win) settleLocked() {
	w.settled.Store(w.npending == 0 && w.rerr == nil && len(w.done) == 0)
}

// lockWaiter is a lock request queued at the target.
type lockWaiter struct {
	src int // world rank
	t   LockType
}

// WinCreate exposes base, of this rank, as a window over c's ranks
// (MPI_Win_create, MPI-4.1 §12.2.1). Collective over c. dispUnit is the
// displacement unit in bytes that origins' displacements into this rank's
// window are scaled by (typically the element size); base may be empty.
// base must stay referenced and is pinned (runtime.Pinner) until Free. T
// must be pointer-free. Errors: ErrComm, ErrDisp (dispUnit < 1), ErrType,
// ErrOther (registration).
func WinCreate[T any](c *Comm, base []T, dispUnit int) (*Win, error) {
	if err := plain[T](); err != nil {
		return nil, err
	}
	return c.winCreate(winMem{mem: raw(base), keep: base}, dispUnit)
}

// WinAllocate allocates n elements of T on this rank and exposes them as a
// window over c's ranks (MPI_Win_allocate, MPI-4.1 §12.2.2), returning the
// window and its memory. Collective over c. dispUnit as WinCreate's.
// Errors: ErrComm, ErrDisp, ErrSize (n < 0), ErrType.
func WinAllocate[T any](c *Comm, n, dispUnit int) (*Win, []T, error) {
	if err := plain[T](); err != nil {
		return nil, nil, err
	}
	if n < 0 {
		return nil, nil, fmt.Errorf("%w: %d elements", ErrSize, n)
	}
	if dispUnit < 1 {
		return nil, nil, fmt.Errorf("%w: displacement unit %d (want at least 1)", ErrDisp, dispUnit)
	}
	if err := c.valid(); err != nil {
		return nil, nil, err
	}
	var z T
	mem, sh, local, lw, err := allocLocal(c, n*int(unsafe.Sizeof(z)))
	if err != nil {
		return nil, nil, err
	}
	w, err := c.winCreate(winMem{mem: mem, sh: sh, local: local, lw: lw}, dispUnit)
	if err != nil {
		if sh != nil {
			sh.unmap()
		}
		return nil, nil, err
	}
	return w, fromRaw[T](mem)[:n:n], nil
}

// winMem is what a window exposes at this rank, as its constructor made it.
type winMem struct {
	mem     []byte
	keep    any        // the memory's owner, kept referenced
	dynamic bool       // WinCreateDynamic: no memory yet
	sh      *sharedWin // the node's mapping (nil: none)
	local   [][]byte   // per rank: its memory in sh (nil: not there)
	lw      []*uint32  // per rank in local: its accumulates' lock word
	shared  bool       // WinAllocateShared
}

// winCreate makes the window over m at every rank of c. Collective over c.
// A rank's own memory is always local: its Puts and Gets to itself are
// copies, its accumulates to itself applied under a lock word its handlers
// also take.
func (c *Comm) winCreate(m winMem, unit int) (*Win, error) {
	mem, dynamic := m.mem, m.dynamic
	if err := c.valid(); err != nil {
		return nil, err
	}
	if unit < 1 {
		return nil, fmt.Errorf("%w: displacement unit %d (want at least 1)", ErrDisp, unit)
	}
	d, err := c.dup()
	if err != nil {
		return nil, err
	}
	p := c.p
	w := &Win{p: p, c: d, id: d.ctx, mem: mem, unit: unit, keep: m.keep, dynamic: dynamic,
		shm: m.sh, local: m.local, lw: m.lw, sharedFlavor: m.shared,
		pending: make([]int, d.size), locks: make([]LockType, d.size),
		granted: make([]bool, d.size), nochk: make([]bool, d.size), unlocked: make([]bool, d.size),
		startGrp: make([]bool, d.size), posted: make([]int, d.size), postGrp: make([]bool, d.size),
		complete: make([]int, d.size), tg: make([]winTarget, d.size)}
	w.settled.Store(true)
	if !dynamic && w.local == nil && len(mem) > 0 {
		w.local, w.lw = make([][]byte, d.size), make([]*uint32, d.size)
		w.local[d.rank], w.lw[d.rank] = mem, &new(lockWords)[0]
	}
	var regErr error
	if len(mem) > 0 {
		w.seg, regErr = p.ep.RegisterSegment(mem)
	}
	if regErr == nil {
		// Known to the handlers before any rank can learn its address: the
		// allgather below completes nowhere before every rank got here.
		p.mu.Lock()
		if p.wins == nil {
			p.wins = map[uint32]*Win{}
		}
		p.wins[w.id] = w
		p.mu.Unlock()
	}
	mine := []uint64{w.seg.Addr, uint64(len(mem)), uint64(unit), 0}
	if regErr != nil {
		mine[3] = 1
	}
	all := make([]uint64, 4*d.size)
	if err := Allgather(d, mine, all); err != nil {
		return nil, err
	}
	w.addrs, w.sizes, w.units = make([]uint64, d.size), make([]int, d.size), make([]int, d.size)
	failed := -1
	for r := range d.size {
		w.addrs[r], w.sizes[r], w.units[r] = all[4*r], int(all[4*r+1]), int(all[4*r+2])
		w.tg[r].unit = uint64(w.units[r])
		if w.local != nil {
			w.tg[r].local = w.local[r]
		}
		if all[4*r+3] != 0 && failed < 0 {
			failed = r
		}
	}
	if failed >= 0 {
		w.release()
		if regErr != nil {
			return nil, fmt.Errorf("%w: window memory of %d bytes: %w", ErrOther, len(mem), regErr)
		}
		return nil, fmt.Errorf("%w: rank %d could not register its window memory", ErrOther, failed)
	}
	return w, nil
}

// release forgets w at this rank: handlers no longer find it, its memory
// is unregistered, its communicator freed.
func (w *Win) release() {
	p := w.p
	p.mu.Lock()
	if p.wins[w.id] == w {
		delete(p.wins, w.id)
	}
	w.freed = true
	w.epochsLocked()
	segs := w.done
	for _, g := range w.gets {
		segs = append(segs, g.seg)
	}
	w.gets, w.done = nil, nil
	w.settleLocked()
	for _, a := range w.attached {
		segs = append(segs, a.seg)
	}
	w.attached = nil
	p.mu.Unlock()
	for _, s := range segs {
		_ = p.ep.UnregisterSegment(s)
	}
	if len(w.mem) > 0 && w.seg.Len > 0 {
		_ = p.ep.UnregisterSegment(w.seg)
	}
	if w.shm != nil {
		w.shm.unmap()
	}
	_ = w.c.free()
}

// Free releases the window (MPI_Win_free, MPI-4.1 §12.2.5). Collective over
// the window's ranks: it completes this rank's operations and waits for every
// rank to do the same, so no operation is under way into any rank's window
// when it returns. Errors: ErrWin (freed already), ErrRMASync (a lock is
// held), a target's failure, ErrProcFailed.
func (w *Win) Free() error {
	if err := w.valid(); err != nil {
		return err
	}
	if err := w.noLocks("Free"); err != nil {
		return err
	}
	werr := w.waitAll()
	if err := w.c.Barrier(); err != nil {
		return err
	}
	w.release()
	return werr
}

// Base is this rank's window memory as bytes (MPI_WIN_BASE): the memory
// WinCreate was given, WinAllocate or WinAllocateShared allocated; nil for
// a dynamic window or an empty one.
func (w *Win) Base() []byte { return w.mem }

// Size is the size of this rank's window, in bytes (MPI_WIN_SIZE).
func (w *Win) Size() int { return len(w.mem) }

// DispUnit is this rank's displacement unit, in bytes (MPI_WIN_DISP_UNIT).
func (w *Win) DispUnit() int { return w.unit }

// Group returns the group of the window's ranks (MPI_Win_get_group).
// Errors: ErrWin.
func (w *Win) Group() (Group, error) {
	if err := w.valid(); err != nil {
		return Group{}, err
	}
	return w.c.Group()
}

// valid reports ErrWin for a nil or freed window.
func (w *Win) valid() error {
	if w == nil || w.p == nil {
		return fmt.Errorf("%w: nil window", ErrWin)
	}
	w.p.mu.Lock()
	freed := w.freed
	w.p.mu.Unlock()
	if freed {
		return fmt.Errorf("%w: window %d has been freed", ErrWin, w.id)
	}
	return nil
}

// noLocks reports ErrRMASync when a passive-target epoch is open.
func (w *Win) noLocks(call string) error {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	if w.nlocks > 0 || w.lockAll {
		return fmt.Errorf("%w: %s with a lock held (Unlock first)", ErrRMASync, call)
	}
	return nil
}

// access checks an operation on n bytes at displacement disp of target's
// window: the window, the rank, the epoch and the range; it returns the byte
// offset in the target's window and the target's world rank. It takes no
// lock: the epoch bits are atomic, the window's shape fixed at creation.
func (w *Win) access(target, disp, n int, call string) (off, world int, err error) {
	if w == nil || w.p == nil || uint(target) >= uint(len(w.tg)) || disp < 0 ||
		w.tg[target].epoch.Load()&epAccess == 0 {
		return 0, 0, w.accessErr(target, disp, call)
	}
	if w.dynamic { // set at creation, never changed
		return disp, w.c.world(target), nil // an address at the target, which checks it
	}
	hi, lo := bits.Mul64(uint64(disp), uint64(w.units[target])) // no division on the hot path
	off = int(lo)
	if hi != 0 || lo > uint64(w.sizes[target]) || n > w.sizes[target]-off {
		return 0, 0, fmt.Errorf("%w: %s of %d bytes at displacement %d (unit %d) of rank %d's window of %d bytes",
			ErrRMARange, call, n, disp, w.units[target], target, w.sizes[target])
	}
	return off, w.c.world(target), nil
}

// accessErr says why access refused an operation to target at disp.
func (w *Win) accessErr(target, disp int, call string) error {
	if err := w.valid(); err != nil {
		return err
	}
	if target < 0 || target >= w.c.size {
		return fmt.Errorf("%w: %s target %d (window has %d ranks)", ErrRank, call, target, w.c.size)
	}
	if w.tg[target].epoch.Load()&epAccess == 0 {
		return fmt.Errorf("%w: %s to rank %d outside an access epoch (Fence or Lock first)", ErrRMASync, call, target)
	}
	return fmt.Errorf("%w: %s at displacement %d", ErrRMARange, call, disp)
}

// localRange is the fast path of an operation on n bytes at displacement
// disp of target's window: the bytes themselves when target's memory is
// local, an access epoch to it open and the range inside it; nil otherwise
// (then access says why, or the operation goes through the network).
func (w *Win) localRange(target, disp, n int) []byte {
	if w == nil || uint(target) >= uint(len(w.tg)) || disp < 0 || n == 0 {
		return nil
	}
	t := &w.tg[target]
	loc := t.local
	if loc == nil || t.epoch.Load()&epAccess == 0 {
		return nil
	}
	hi, lo := bits.Mul64(uint64(disp), t.unit)
	if hi != 0 || lo > uint64(len(loc)) || uint64(n) > uint64(len(loc))-lo {
		return nil
	}
	return loc[lo : lo+uint64(n)]
}

// begin counts one operation to target as outstanding.
func (w *Win) begin(target int) {
	w.p.mu.Lock()
	w.pending[target]++
	w.npending++
	w.settleLocked()
	w.p.mu.Unlock()
}

// doneLocked counts one operation to target as acknowledged, recording a
// failure the target reported. p.mu held.
func (w *Win) doneLocked(target int, err error) {
	if w.pending[target] > 0 {
		w.pending[target]--
		w.npending--
	}
	if err != nil && w.rerr == nil {
		w.rerr = err
	}
	w.settleLocked()
}

// takeErr returns and clears the failure recorded since the last
// synchronization.
func (w *Win) takeErr() error {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	err := w.rerr
	w.rerr = nil
	w.settleLocked()
	return err
}

// waitTarget waits until every operation to target is acknowledged, then
// returns what failed meanwhile. Errors: ErrProcFailed when a rank of the
// window fails while it waits.
func (w *Win) waitTarget(target int) error {
	p := w.p
	if err := p.waitColl(w.c, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return w.pending[target] == 0
	}); err != nil {
		return err
	}
	w.releaseGets()
	return w.takeErr()
}

// waitAll is waitTarget for every target.
func (w *Win) waitAll() error {
	p := w.p
	if err := p.waitColl(w.c, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return w.npending == 0
	}); err != nil {
		return err
	}
	w.releaseGets()
	return w.takeErr()
}

// releaseGets unregisters the result buffers of the Gets that completed.
func (w *Win) releaseGets() {
	p := w.p
	p.mu.Lock()
	done := w.done
	w.done = nil
	w.settleLocked()
	p.mu.Unlock()
	for _, s := range done {
		_ = p.ep.UnregisterSegment(s)
	}
}

// Put writes origin into target's window at displacement disp, in units of
// the target's displacement unit (MPI_Put, MPI-4.1 §12.3.1). It returns when
// origin may be reused; the data is in the target's window once a Flush,
// Unlock or Fence that follows returns. Errors: ErrWin, ErrRank, ErrRMASync
// (no access epoch to target), ErrRMARange, ErrType, ErrProcFailed, ErrOther.
func Put[T any](w *Win, origin []T, target, disp int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return w.put(raw(origin), target, disp)
}

func (w *Win) put(data []byte, target, disp int) error {
	if loc := w.localRange(target, disp, len(data)); loc != nil {
		memcopy.Copy(loc, data) // in place: complete at origin and target
		return nil
	}
	off, world, err := w.access(target, disp, len(data), "Put")
	if err != nil || len(data) == 0 {
		return err
	}
	return w.putAt(data, target, world, off)
}

// putAt puts data at byte offset off of target's window (an address in a
// dynamic window's), checked by the caller (or, dynamic, by the target).
func (w *Win) putAt(data []byte, target, world, off int) error {
	if w.local != nil && w.local[target] != nil {
		memcopy.Copy(w.local[target][off:], data) // in place: complete at origin and target
		return nil
	}
	if w.dynamic { // set at creation, never changed
		return w.putChecked(data, target, world, off)
	}
	w.begin(target)
	if err := w.p.ep.Store(world, hRMAPut, w.addrs[target]+uint64(off), data, uint64(w.id)); err != nil {
		w.abandon(target)
		return w.p.netErr(w.c, world, fmt.Sprintf("Put to rank %d", target), err)
	}
	return nil
}

// abandon uncounts an operation whose request never left.
func (w *Win) abandon(target int) {
	w.p.mu.Lock()
	w.doneLocked(target, nil)
	w.p.mu.Unlock()
}

// Get reads len(result) elements from target's window at displacement disp
// into result (MPI_Get, MPI-4.1 §12.3.2). Over a network with a single-copy
// read (shared memory) it returns with the data in place; elsewhere the target
// stores it into result, which must not be touched until a Flush, Unlock or
// Fence that follows returns. Errors as Put's.
func Get[T any](w *Win, result []T, target, disp int) error {
	if err := plain[T](); err != nil {
		return err
	}
	return w.get(raw(result), target, disp, nil)
}

func (w *Win) get(buf []byte, target, disp int, req *reqState) error {
	if loc := w.localRange(target, disp, len(buf)); loc != nil && req == nil {
		memcopy.Copy(buf, loc)
		return nil
	}
	off, world, err := w.access(target, disp, len(buf), "Get")
	if err != nil || len(buf) == 0 {
		return err
	}
	return w.getAt(buf, target, world, off, req, nil)
}

// getAt gets len(buf) bytes at byte offset off of target's window into buf,
// as putAt puts; req (nil: none) completes and then (nil: nothing) runs when
// the data is in buf.
func (w *Win) getAt(buf []byte, target, world, off int, req *reqState, then func()) error {
	p := w.p
	done := func() {
		if then != nil {
			then()
		}
		if req != nil {
			req.complete(Status{})
		}
	}
	if w.local != nil && w.local[target] != nil {
		memcopy.Copy(buf, w.local[target][off:])
		done()
		return nil
	}
	addr := w.addrs[target] + uint64(off)
	if !w.dynamic && p.ep.CanGet(world, len(buf)) { // a dynamic window's target checks the range first
		err := p.ep.Get(world, addr, buf)
		if err == nil {
			done()
			return nil
		}
		if !errors.Is(err, transport.ErrGetUnsupported) {
			return p.netErr(w.c, world, fmt.Sprintf("Get from rank %d", target), err)
		}
	}
	cookie, seg, err := w.startGet(buf, target, 1, req)
	if err == nil && then != nil {
		p.mu.Lock()
		w.gets[cookie].then = then
		p.mu.Unlock()
	}
	if err != nil {
		return err
	}
	if err := p.ep.RequestShort(world, hRMAGet, uint64(w.id), uint64(off), uint64(len(buf)), seg.Addr, cookie); err != nil {
		w.abandonGet(target, cookie)
		return p.netErr(w.c, world, fmt.Sprintf("Get from rank %d", target), err)
	}
	return nil
}

// startGet registers buf for a target's stores of parts pieces and counts
// them as outstanding to target; req (nil: none) completes with the last.
// Errors: ErrBuffer (registration).
func (w *Win) startGet(buf []byte, target, parts int, req *reqState) (uint64, am.Segment, error) {
	p := w.p
	seg, err := p.ep.RegisterSegment(buf)
	if err != nil {
		return 0, seg, fmt.Errorf("%w: result buffer of %d bytes for rank %d: %w", ErrBuffer, len(buf), target, err)
	}
	p.mu.Lock()
	w.cookie++
	cookie := w.cookie
	if w.gets == nil {
		w.gets = map[uint64]*getOp{}
	}
	w.gets[cookie] = &getOp{seg: seg, parts: parts, req: req}
	w.pending[target] += parts
	w.npending += parts
	w.settleLocked()
	p.mu.Unlock()
	return cookie, seg, nil
}

// abandonGet uncounts the pieces of a get whose requests never left.
func (w *Win) abandonGet(target int, cookie uint64) {
	p := w.p
	p.mu.Lock()
	if g := w.gets[cookie]; g != nil {
		for range g.parts {
			w.doneLocked(target, nil)
		}
		delete(w.gets, cookie)
		w.done = append(w.done, g.seg)
		w.settleLocked()
	}
	p.mu.Unlock()
}

// getDoneLocked records one piece of get cookie from target as landed (err:
// or failed), completing its request with the last. p.mu held.
func (w *Win) getDoneLocked(target int, cookie uint64, err error) {
	g := w.gets[cookie]
	if g == nil {
		return
	}
	w.doneLocked(target, err)
	if err != nil && g.err == nil {
		g.err = err
	}
	if g.parts--; g.parts > 0 {
		return
	}
	delete(w.gets, cookie)
	w.done = append(w.done, g.seg)
	w.settleLocked()
	if g.then != nil && g.err == nil {
		g.then()
	}
	if g.req != nil {
		g.req.complete(Status{Err: g.err})
	}
}

// Fence ends the current fence epoch and opens the next (MPI_Win_fence,
// MPI-4.1 §12.5.1). Collective over the window's ranks: when it returns,
// every operation any rank started on the window before it is complete at
// its origin and its target. assert: Mode* bits (ModeNosucceed: no epoch
// follows). Errors: ErrWin, ErrAssert, ErrRMASync (a lock is held), a
// target's failure (ErrRMARange, ErrWin), ErrProcFailed.
func (w *Win) Fence(assert int) error {
	if err := w.valid(); err != nil {
		return err
	}
	if assert&^modeAll != 0 {
		return fmt.Errorf("%w: %#x", ErrAssert, assert)
	}
	if err := w.noLocks("Fence"); err != nil {
		return err
	}
	werr := w.waitAll()
	if err := w.c.Barrier(); err != nil {
		return err
	}
	w.p.mu.Lock()
	w.fence = assert&ModeNosucceed == 0
	w.epochsLocked()
	w.p.mu.Unlock()
	return werr
}

// Lock starts a passive-target access epoch to target (MPI_Win_lock, MPI-4.1
// §12.5.3): it returns once the lock is granted (ModeNocheck: at once, the
// program promising that no conflicting lock is held). Errors: ErrWin,
// ErrRank, ErrLocktype, ErrAssert, ErrRMASync (target already locked, or
// LockAll held), ErrProcFailed.
func (w *Win) Lock(t LockType, target, assert int) error {
	if err := w.valid(); err != nil {
		return err
	}
	if t != LockExclusive && t != LockShared {
		return fmt.Errorf("%w: %d", ErrLocktype, t)
	}
	if assert&^ModeNocheck != 0 {
		return fmt.Errorf("%w: %#x (Lock takes ModeNocheck only)", ErrAssert, assert)
	}
	if target < 0 || target >= w.c.size {
		return fmt.Errorf("%w: Lock target %d (window has %d ranks)", ErrRank, target, w.c.size)
	}
	p := w.p
	p.mu.Lock()
	if w.locks[target] != 0 || w.lockAll {
		p.mu.Unlock()
		return fmt.Errorf("%w: rank %d's window is locked by this rank already", ErrRMASync, target)
	}
	w.locks[target] = t
	w.nlocks++
	w.epochLocked(target)
	w.nochk[target] = assert&ModeNocheck != 0
	w.granted[target] = w.nochk[target]
	w.unlocked[target] = false
	p.mu.Unlock()
	if assert&ModeNocheck != 0 {
		return nil
	}
	if ls := w.lockState(target); ls != nil && tryLockState(ls, t, true) {
		p.mu.Lock() // taken in the node mapping: no message
		w.granted[target] = true
		p.mu.Unlock()
		return nil
	}
	world := w.c.world(target)
	err := p.ep.RequestShort(world, hRMALock, uint64(w.id), uint64(t))
	if err == nil {
		err = p.waitColl(w.c, func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return w.granted[target]
		})
	} else {
		err = p.netErr(w.c, world, fmt.Sprintf("Lock of rank %d", target), err)
	}
	if err != nil {
		p.mu.Lock()
		w.locks[target] = 0
		w.nlocks--
		w.epochLocked(target)
		p.mu.Unlock()
	}
	return err
}

// Unlock completes every operation to target and ends the epoch Lock
// started (MPI_Win_unlock, MPI-4.1 §12.5.3). Errors: ErrWin, ErrRank,
// ErrRMASync (target not locked by Lock), a target's failure, ErrProcFailed.
func (w *Win) Unlock(target int) error {
	if err := w.valid(); err != nil {
		return err
	}
	if target < 0 || target >= w.c.size {
		return fmt.Errorf("%w: Unlock target %d (window has %d ranks)", ErrRank, target, w.c.size)
	}
	p := w.p
	p.mu.Lock()
	t := w.locks[target]
	p.mu.Unlock()
	if t == 0 {
		return fmt.Errorf("%w: Unlock of rank %d, which this rank has not locked", ErrRMASync, target)
	}
	werr := w.waitTarget(target)
	err := w.unlock(target)
	p.mu.Lock()
	w.locks[target] = 0
	w.nlocks--
	w.epochLocked(target)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	return werr
}

// unlock releases target's lock there (nothing to release after a
// ModeNocheck lock, which took none) and waits for the acknowledgement.
func (w *Win) unlock(target int) error {
	p := w.p
	p.mu.Lock()
	nochk := w.nochk[target]
	p.mu.Unlock()
	if nochk {
		return nil
	}
	if ls := w.lockState(target); ls != nil && unlockState(ls, true) {
		return nil // released in the node mapping: nobody is queued for it
	}
	world := w.c.world(target)
	if err := p.ep.RequestShort(world, hRMAUnlock, uint64(w.id)); err != nil {
		return p.netErr(w.c, world, fmt.Sprintf("Unlock of rank %d", target), err)
	}
	return p.waitColl(w.c, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return w.unlocked[target]
	})
}

// LockAll starts a shared passive-target epoch to every rank of the window
// (MPI_Win_lock_all, MPI-4.1 §12.5.3). Errors as Lock's.
func (w *Win) LockAll(assert int) error {
	if err := w.valid(); err != nil {
		return err
	}
	if err := w.noLocks("LockAll"); err != nil {
		return err
	}
	for r := range w.c.size {
		if err := w.Lock(LockShared, r, assert); err != nil {
			for q := range r {
				_ = w.Unlock(q)
			}
			return err
		}
	}
	w.p.mu.Lock()
	w.lockAll = true
	w.epochsLocked()
	w.p.mu.Unlock()
	return nil
}

// UnlockAll completes every operation and ends the epoch LockAll started
// (MPI_Win_unlock_all). Errors: ErrWin, ErrRMASync (no LockAll), a target's
// failure, ErrProcFailed.
func (w *Win) UnlockAll() error {
	if err := w.valid(); err != nil {
		return err
	}
	w.p.mu.Lock()
	all := w.lockAll
	w.lockAll = false
	w.epochsLocked()
	w.p.mu.Unlock()
	if !all {
		return fmt.Errorf("%w: UnlockAll without LockAll", ErrRMASync)
	}
	var first error
	for r := range w.c.size {
		if err := w.Unlock(r); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Flush completes every operation this rank started to target, at the origin
// and at the target, within a passive-target epoch (MPI_Win_flush, MPI-4.1
// §12.5.4). Errors: ErrWin, ErrRank, ErrRMASync (target not locked), a
// target's failure, ErrProcFailed.
func (w *Win) Flush(target int) error {
	if w != nil && uint(target) < uint(len(w.tg)) &&
		w.tg[target].epoch.Load()&epPassive != 0 && w.settled.Load() {
		// Nothing under way (the Puts and Gets were copies), but a rank
		// that spins on Flush, say waiting for a mutex in its own window,
		// still owes the others its progress: their requests wait for it.
		w.p.progress()
		return nil
	}
	if w == nil || w.p == nil || target < 0 || target >= w.c.size {
		if err := w.valid(); err != nil {
			return err
		}
		return fmt.Errorf("%w: Flush target %d (window has %d ranks)", ErrRank, target, w.c.size)
	}
	w.p.mu.Lock()
	freed := w.freed
	locked := w.locks[target] != 0 || w.lockAll
	idle := w.pending[target] == 0 && w.rerr == nil && len(w.done) == 0
	w.p.mu.Unlock()
	if freed {
		return fmt.Errorf("%w: window %d has been freed", ErrWin, w.id)
	}
	if !locked {
		return fmt.Errorf("%w: Flush of rank %d outside a passive-target epoch", ErrRMASync, target)
	}
	if idle {
		w.p.progress() // nothing under way to target, but progress as above
		return nil
	}
	return w.waitTarget(target)
}

// FlushAll is Flush to every rank (MPI_Win_flush_all). Errors as Flush's.
func (w *Win) FlushAll() error {
	if err := w.valid(); err != nil {
		return err
	}
	w.p.mu.Lock()
	locked := w.nlocks > 0 || w.lockAll
	w.p.mu.Unlock()
	if !locked {
		return fmt.Errorf("%w: FlushAll outside a passive-target epoch", ErrRMASync)
	}
	w.p.progress() // waitAll returns at once when nothing is under way; progress as Flush does
	return w.waitAll()
}

// FlushLocal completes this rank's operations to target at the origin
// (MPI_Win_flush_local): origin buffers may be reused and Get results
// read. Puts and accumulates are complete at the origin when their calls
// return, so it waits for the Gets, and, being no cheaper, as Flush does.
// Errors as Flush's.
func (w *Win) FlushLocal(target int) error { return w.Flush(target) }

// FlushLocalAll is FlushLocal to every rank (MPI_Win_flush_local_all).
// Errors as FlushAll's.
func (w *Win) FlushLocalAll() error { return w.FlushAll() }

// Sync synchronizes the public and private copies of the window
// (MPI_Win_sync): amgo's windows have one copy (the unified model, MPI-4.1
// §12.4), which the Go memory model keeps consistent at every MPI call, so
// it checks the window and polls once: a rank that spins on Sync waiting
// for a flag in a shared window makes progress for the others meanwhile.
// Errors: ErrWin.
func (w *Win) Sync() error {
	if err := w.valid(); err != nil {
		return err
	}
	w.p.progress()
	return nil
}

// rmaHandlers are the handlers of one-sided communication.
func (p *proc) rmaHandlers() []handlers.Entry {
	return []handlers.Entry{
		{Index: hRMAPut, Name: "mpi.rma.put", NArgs: 1, Fn: p.onRMAPut},
		{Index: hRMAAck, Name: "mpi.rma.ack", NArgs: 2, Fn: p.onRMAAck},
		{Index: hRMAAcc, Name: "mpi.rma.acc", NArgs: 3, Fn: p.onRMAAcc},
		{Index: hRMAGet, Name: "mpi.rma.get", NArgs: 5, Fn: p.onRMAGet},
		{Index: hRMAGetDone, Name: "mpi.rma.get.done", NArgs: 3, Fn: p.onRMAGetDone},
		{Index: hRMAGetAcc, Name: "mpi.rma.getacc", NArgs: 5, Fn: p.onRMAGetAcc},
		{Index: hRMAPost, Name: "mpi.rma.post", NArgs: 1, Fn: p.onRMAPost},
		{Index: hRMAComplete, Name: "mpi.rma.complete", NArgs: 1, Fn: p.onRMAComplete},
		{Index: hRMAPutMed, Name: "mpi.rma.put.checked", NArgs: 2, Fn: p.onRMAPutMed},
		{Index: hRMAPutV, Name: "mpi.rma.put.runs", NArgs: 2, Fn: p.onRMAPutV},
		{Index: hRMAAccV, Name: "mpi.rma.acc.runs", NArgs: 2, Fn: p.onRMAAccV},
		{Index: hRMAGetV, Name: "mpi.rma.get.runs", NArgs: 3, Fn: p.onRMAGetV},
		{Index: hRMAGetAccV, Name: "mpi.rma.getacc.runs", NArgs: 4, Fn: p.onRMAGetAccV},
		{Index: hRMALock, Name: "mpi.rma.lock", NArgs: 2, Fn: p.onRMALock},
		{Index: hRMAGrant, Name: "mpi.rma.grant", NArgs: 1, Fn: p.onRMAGrant},
		{Index: hRMAUnlock, Name: "mpi.rma.unlock", NArgs: 1, Fn: p.onRMAUnlock},
		{Index: hRMAFetch, Name: "mpi.rma.fetch", NArgs: 4, Fn: p.onRMAFetch},
		{Index: hRMAFetched, Name: "mpi.rma.fetched", NArgs: 3, Fn: p.onRMAFetched},
	}
}

// winLocked finds window id; nil when this rank has none. p.mu held.
func (p *proc) winLocked(id uint64) *Win {
	if id > 1<<32-1 {
		return nil
	}
	return p.wins[uint32(id)]
}

// originLocked finds window id and world rank src's rank in it, for a
// handler at the origin: (nil, -1) when either is missing. p.mu held.
func (p *proc) originLocked(id uint64, src int) (*Win, int) {
	w := p.winLocked(id)
	if w == nil {
		return nil, -1
	}
	return w, commRankOf(w.c, src)
}

// ack replies to an operation's request with status st.
func rmaAck(tok *handlers.Token, id uint64, st uint64) {
	_ = tok.ReplyShort(hRMAAck, id, st)
}

// rmaErr is the origin's error for status st from rank src (a world rank).
func rmaErr(st uint64, src int) error {
	switch st {
	case rmaOK, rmaUnlocked:
		return nil
	case rmaNoWin:
		return fmt.Errorf("%w: world rank %d has no such window (freed?)", ErrWin, src)
	case rmaRange:
		return fmt.Errorf("%w: an operation fell outside world rank %d's window", ErrRMARange, src)
	case rmaBadOp:
		return fmt.Errorf("%w: world rank %d does not know an accumulate's operation", ErrOp, src)
	}
	return fmt.Errorf("%w: world rank %d answered with status %d", ErrIntern, src, st)
}

// regionLocked is the memory of the window's bytes [off, off+n) at this
// rank, nil when they are not all in it: offsets from the window's start,
// or, in a dynamic window, addresses inside one attached region. p.mu held.
func (w *Win) regionLocked(off, n uint64) []byte {
	if w.dynamic {
		for _, a := range w.attached {
			base := uint64(a.seg.Addr)
			if off >= base && off-base <= uint64(len(a.mem)) && n <= uint64(len(a.mem))-(off-base) {
				return a.mem[off-base : off-base+n : off-base+n]
			}
		}
		return nil
	}
	if off > uint64(len(w.mem)) || n > uint64(len(w.mem))-off {
		return nil
	}
	return w.mem[off : off+n : off+n]
}

// onRMAPut runs at the target once a Put's data is in the window.
func (p *proc) onRMAPut(tok *handlers.Token, a []uint64, _ []byte) {
	p.mu.Lock()
	w := p.winLocked(a[0])
	p.mu.Unlock()
	st := uint64(rmaOK)
	if w == nil {
		st = rmaNoWin
	}
	rmaAck(tok, a[0], st)
}

// onRMAAck runs at the origin: an operation, or an Unlock, is done.
func (p *proc) onRMAAck(tok *handlers.Token, a []uint64, _ []byte) {
	src := tok.Source()
	p.mu.Lock()
	defer p.mu.Unlock()
	w, target := p.originLocked(a[0], src)
	if target < 0 {
		return
	}
	if a[1] == rmaUnlocked {
		w.unlocked[target] = true
		return
	}
	w.doneLocked(target, rmaErr(a[1], src))
}

// onRMAGet runs at the target: store the range asked for into the origin's
// buffer, from the deferred work (a store may wait for credit, which a
// handler must not).
func (p *proc) onRMAGet(tok *handlers.Token, a []uint64, _ []byte) {
	src := tok.Source()
	p.mu.Lock()
	defer p.mu.Unlock()
	id, off, n, addr, cookie := a[0], a[1], a[2], a[3], a[4]
	w := p.winLocked(id)
	st := uint64(rmaOK)
	var data []byte
	if w == nil {
		st = rmaNoWin
	} else if data = w.regionLocked(off, n); data == nil {
		st = rmaRange
	}
	p.storeBackLocked(src, id, addr, cookie, data, st)
}

// storeBackLocked queues the store of data into the origin's buffer at addr
// with the get's completion (a store may wait for credit, which a handler
// must not); a failure st goes back with no data. p.mu held.
func (p *proc) storeBackLocked(src int, id, addr, cookie uint64, data []byte, st uint64) {
	p.queueLocked(deferred{kind: workFunc, fn: func() {
		var err error
		if st == rmaOK && len(data) > 0 {
			err = p.ep.Store(src, hRMAGetDone, addr, data, id, st, cookie)
		} else {
			err = p.ep.RequestShort(src, hRMAGetDone, id, st, cookie)
		}
		if err != nil {
			p.dropped(fmt.Errorf("one-sided data for world rank %d: %w", src, err))
		}
	}})
}

// onRMAGetDone runs at the origin once a Get's data has landed.
func (p *proc) onRMAGetDone(tok *handlers.Token, a []uint64, _ []byte) {
	src := tok.Source()
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.winLocked(a[0]); w != nil {
		if t := commRankOf(w.c, src); t >= 0 {
			w.getDoneLocked(t, a[2], rmaErr(a[1], src))
		}
	}
}

// onRMALock runs at the target: grant the lock now if it is free for this
// kind, else queue the request until an Unlock frees it.
func (p *proc) onRMALock(tok *handlers.Token, a []uint64, _ []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.winLocked(a[0])
	t := LockType(a[1])
	if w == nil || (t != LockShared && t != LockExclusive) {
		p.dropped(fmt.Errorf("lock request for window %d of kind %d from world rank %d: no such window or kind", a[0], a[1], tok.Source()))
		return
	}
	if len(w.waiters) == 0 && w.tryTakeLocked(t) {
		_ = tok.ReplyShort(hRMAGrant, a[0])
		return
	}
	w.waiters = append(w.waiters, lockWaiter{src: tok.Source(), t: t})
	if ls := w.lockState(w.c.rank); ls != nil {
		// Node mates stop taking the lock directly, and release it through
		// here; one may have released it since the attempt above.
		atomic.OrUint32(ls, lockQueued)
		p.grantWaitersLocked(w)
	}
}

// tryTakeLocked takes a lock of kind t at this rank's window if it can be
// held now, and reports whether it did: in the lock-state word when this
// rank has one (its node mates take and release it there directly), else in
// the window's counts. p.mu held.
func (w *Win) tryTakeLocked(t LockType) bool {
	if ls := w.lockState(w.c.rank); ls != nil {
		return tryLockState(ls, t, false)
	}
	switch {
	case t == LockShared && !w.excl:
		w.shared++
	case t == LockExclusive && !w.excl && w.shared == 0:
		w.excl = true
	default:
		return false
	}
	return true
}

// releaseLocked releases one lock held at this rank's window (its kind
// follows from the state: an exclusive lock excludes all others). p.mu held.
func (w *Win) releaseLocked() {
	if ls := w.lockState(w.c.rank); ls != nil {
		unlockState(ls, false)
		return
	}
	switch {
	case w.excl:
		w.excl = false
	case w.shared > 0:
		w.shared--
	}
}

// grantWaitersLocked grants the queued lock requests that can be held now,
// in their order (a shared request behind an exclusive one waits, so an
// exclusive lock is not starved), each grant a request sent from deferred
// work (a handler must not wait for credit). Once the queue is empty node
// mates may take the lock directly again. p.mu held.
func (p *proc) grantWaitersLocked(w *Win) {
	id := uint64(w.id)
	for len(w.waiters) > 0 && w.tryTakeLocked(w.waiters[0].t) {
		q := w.waiters[0]
		w.waiters = w.waiters[1:]
		p.queueLocked(deferred{kind: workFunc, fn: func() {
			if err := p.ep.RequestShort(q.src, hRMAGrant, id); err != nil {
				p.dropped(fmt.Errorf("lock grant for world rank %d: %w", q.src, err))
			}
		}})
	}
	if ls := w.lockState(w.c.rank); ls != nil && len(w.waiters) == 0 {
		atomic.AndUint32(ls, ^uint32(lockQueued))
	}
}

// onRMAGrant runs at the origin: its lock request was granted.
func (p *proc) onRMAGrant(tok *handlers.Token, a []uint64, _ []byte) {
	src := tok.Source()
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.winLocked(a[0]); w != nil {
		if t := commRankOf(w.c, src); t >= 0 {
			w.granted[t] = true
		}
	}
}

// onRMAUnlock runs at the target: release one lock, acknowledge, and grant
// the queued requests that can be held now, in their order (a shared one
// behind an exclusive one waits, so an exclusive lock is not starved).
func (p *proc) onRMAUnlock(tok *handlers.Token, a []uint64, _ []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.winLocked(a[0])
	if w == nil {
		rmaAck(tok, a[0], rmaNoWin)
		return
	}
	w.releaseLocked()
	rmaAck(tok, a[0], rmaUnlocked)
	p.grantWaitersLocked(w)
}
