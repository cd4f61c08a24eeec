package mpiam

import (
	"sync"

	"github.com/amgo-hpc/amgo/internal/locks"
)

// reqCacheMax is the most idle operation states a rank keeps for reuse (384
// bytes each): more than osu_bw's window of 64 sends or receives, so a
// windowed stream allocates none, and a burst of many more returns its surplus
// to the garbage collector.
const reqCacheMax = 1024

// reqCache recycles a rank's operation states. Any goroutine may use it
// (MPI_THREAD_MULTIPLE). States of blocking calls (one at a time per
// goroutine) go through a sync.Pool, whose per-P private slot costs no atomic
// operation; states behind handles, many outstanding at once (osu_bw's window
// of 64), through a mutex-guarded stack that takes a Waitall's states back in
// one critical section (a sync.Pool keeps all but one of them in per-P
// dequeues at ~20 ns per Get or Put here). At a single-threaded level
// (thread.go) blocking calls use the stack too; there Irecv and an eager
// Isend take their state, and spent states go back, without the lock's flag
// (the matching lock's flag catches a second goroutine). docs/performance.md
// has the figures.
type reqCache struct {
	pool sync.Pool // states of blocking calls

	mu     locks.Mutex // a plain flag at a single-threaded level
	free   stateStack  // idle states of nonblocking calls
	slab   []reqState  // the current slab's unused states (under slabMu)
	slabMu sync.Mutex  // newState runs outside mu
}

// stateStack is a stack of idle operation states.
type stateStack []*reqState

// pop takes the top state, nil if the stack is empty.
func (st *stateStack) pop() *reqState {
	n := len(*st)
	if n == 0 {
		return nil
	}
	s := (*st)[n-1]
	(*st)[n-1] = nil
	*st = (*st)[:n-1]
	return s
}

// stateSlab is how many operation states are allocated at once: 96 × 384
// bytes, past the 32 KiB above which Go allocates an object on pages of its
// own with nothing before it (smaller objects that hold pointers start 8
// bytes into their slot), so that every state starts a cache line and its
// hot part (reqHot) takes three whole lines, and a window of states in
// flight is contiguous rather than spread over padded single allocations.
const stateSlab = 96

// newState returns a zeroed state from the current slab, starting a new one
// when it is spent.
func (c *reqCache) newState() *reqState {
	c.slabMu.Lock()
	if len(c.slab) == 0 {
		c.slab = make([]reqState, stateSlab)
	}
	s := &c.slab[0]
	c.slab = c.slab[1:]
	c.slabMu.Unlock()
	return s
}

// get returns a zeroed state and, with handle, a new handle for it (the
// null one without). States for a handle are reused from the stack, others
// from the pool.
func (c *reqCache) get(handle bool) (*reqState, Request) {
	if !handle {
		var s *reqState
		if c.mu.Sequential() {
			// One call at a time: the stack costs a slice pop, where the
			// pool pins the P and looks in its per-P slot.
			s = c.popLocked()
		} else {
			s, _ = c.pool.Get().(*reqState)
		}
		if s == nil {
			s = c.newState()
		}
		return s, Request{}
	}
	c.mu.Lock()
	s := c.popLocked()
	c.mu.Unlock()
	if s == nil {
		s = c.newState()
	}
	return s, handleOf(s)
}

// popLocked takes an idle state off the stack, nil if it is empty; c.mu
// held (or a single-threaded level).
func (c *reqCache) popLocked() *reqState { return c.free.pop() }

// put zeroes the state of a blocking call, dropping what it references, and
// keeps it for reuse. The caller guarantees that nothing references s any
// more.
func (c *reqCache) put(s *reqState) {
	s.reset()
	if c.mu.Sequential() {
		if len(c.free) < reqCacheMax {
			c.free = append(c.free, s)
		}
		return
	}
	c.pool.Put(s)
}

// stateBatch gathers the states a Waitall reports and puts them back to their
// rank's cache with one lock acquisition per batch instead of one per request.
type stateBatch struct {
	n int
	p *proc // the rank of the queued states
	s [32]*reqState
}

// add queues s, not nil; states of another rank flush the batch first. At a
// single-threaded level, where the cache takes no lock, s goes straight back
// (put): queueing it would cost more than it saves.
func (b *stateBatch) add(s *reqState) {
	if c := &s.p.states; c.mu.Sequential() {
		c.put(s)
		return
	}
	if b.n == len(b.s) || b.p != s.p {
		b.flushFor(s.p)
	}
	b.s[b.n] = s
	b.n++
}

// flushFor puts the queued states back and makes p the batch's rank.
func (b *stateBatch) flushFor(p *proc) {
	b.flush()
	b.p = p
}

// flush puts the queued states back.
func (b *stateBatch) flush() {
	if b.n == 0 {
		return
	}
	b.p.states.putAll(b.s[:b.n])
	clear(b.s[:b.n])
	b.n = 0
}

// putAll keeps the states of reported nonblocking calls for reuse (see put).
func (c *reqCache) putAll(ss []*reqState) {
	for _, s := range ss {
		s.reset()
	}
	c.mu.Lock()
	for _, s := range ss {
		if len(c.free) == reqCacheMax {
			break
		}
		c.free = append(c.free, s)
	}
	c.mu.Unlock()
}

// recvBatch is how many states a recvStack takes from the cache at a time.
const recvBatch = 16

// recvStack holds a few states for the nonblocking receives of a rank
// running with locks (ThreadMultiple), guarded by the rank's matching lock:
// an Irecv takes its state under the lock it posts with, one locked
// instruction instead of two. The states come
// from the rank's cache recvBatch at a time (lock order: proc.mu, then
// reqCache.mu, which is a leaf), and go back to it when their requests
// are freed, as every state does.
type recvStack struct {
	free stateStack
}

// getLocked returns a state for a receive; p.mu is held.
func (rs *recvStack) getLocked(c *reqCache) *reqState {
	if len(rs.free) == 0 {
		rs.free = c.getMany(rs.free, recvBatch)
	}
	return rs.free.pop()
}

// getMany appends n idle states to dst, new ones where the cache has too
// few.
func (c *reqCache) getMany(dst stateStack, n int) stateStack {
	c.mu.Lock()
	for len(dst) < n {
		s := c.popLocked()
		if s == nil {
			break
		}
		dst = append(dst, s)
	}
	c.mu.Unlock()
	for len(dst) < n {
		dst = append(dst, c.newState())
	}
	return dst
}
