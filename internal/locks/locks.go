// Package locks has the mutex of a layer whose client may promise to make
// one call at a time: GASNet-EX's GASNET_SEQ and GASNET_PARSYNC modes, MPI's
// MPI_THREAD_SINGLE, FUNNELED and SERIALIZED levels (MPI-4.1 §11.6.1).
//
// Under such a promise a lock guards nothing that another thread could
// touch, and its locked instructions cost the most exactly where they buy
// nothing: the first one after a store to a line that another core polls
// (a shared-memory ring's record) waits for that line's ownership, one
// cross-core round trip per message. A Mutex in sequential mode is a plain
// flag instead: no atomic instruction, no fence.
//
// A client that breaks its promise is caught where that is cheap: a Lock
// that finds the flag set (in sequential mode only another goroutine can
// have set it, since the owner's code never locks twice) records the
// collision in the shared Seq and waits for the flag to clear before it
// goes on, so that the colliding goroutine does not run the critical
// section beside the other; the layer reports Seq.Collided as an error at
// its next call. Two goroutines that both find the flag clear at the same
// instant are not caught this way; under the race detector the flag's plain
// accesses are themselves a reported race, so a test of the misuse fails
// there.
//
// Outside a sequential mode a Mutex is a spin lock whose Unlock is a plain
// store with release order (a MOV on amd64) rather than sync.Mutex's
// locked add: on the message path the unlock follows a store to a line that
// another core polls, and a locked instruction there would wait for that
// line as above. A Lock that finds the lock taken yields its processor to
// other goroutines (runtime.Gosched) between tries, and after spinYields
// tries sleeps between them, so that a holder that stays long (a poll
// asleep on the network) is not raced by a burning waiter; from then on
// TryLock fails for everyone else, so that a loop that takes the lock
// again and again with TryLock (a poller) cannot starve it. There is no
// queue of waiters and no hand-off: the locks of this module are held for
// short critical sections by few goroutines.
package locks

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/amgo-hpc/amgo/internal/release"
)

// spinYields is how many tries a contended Lock makes, yielding to other
// goroutines between them, before it sleeps sleepEvery between tries.
const (
	spinYields = 1 << 10
	sleepEvery = 20 * time.Microsecond
)

// Seq is the promise of one layer's client to make one call at a time, and
// what its mutexes found. The zero value is not sequential.
type Seq struct {
	on bool
	// collided is a plain flag: only the client's one goroutine at a time
	// reads and writes it, unless the promise is broken, which is what it
	// records.
	collided bool
}

// NewSeq returns the sequential mode of one layer instance: its mutexes
// given to SetSeq become plain flags.
func NewSeq() *Seq { return &Seq{on: true} }

// Collided reports whether a mutex of this mode was found taken by another
// goroutine: the client broke its promise.
func (s *Seq) Collided() bool { return s != nil && s.collided }

// Mutex is a mutual-exclusion lock with a release-store unlock (see the
// package comment), or a plain flag once SetSeq has put it in a sequential
// mode. The zero value is an unlocked Mutex.
type Mutex struct {
	held     uint32 // 1 while locked: atomic, or a plain flag in sequential mode
	starving uint32 // Locks that have tried spinYields times: TryLock leaves m to them
	seq      *Seq
}

// SetSeq puts m in sequential mode s (nil: back to a lock for concurrent
// use). Call it before m is first used and never while m is locked.
func (m *Mutex) SetSeq(s *Seq) {
	if s != nil && !s.on {
		s = nil
	}
	m.seq = s
}

// Sequential reports whether m is in a sequential mode (a plain flag).
func (m *Mutex) Sequential() bool { return m.seq != nil }

// Lock locks m. In sequential mode it inlines to a test and a store of
// the flag; a flag found set is another goroutine inside (lockSlow).
func (m *Mutex) Lock() {
	if m.seq != nil && m.held == 0 {
		m.held = 1
		return
	}
	m.lockSlow()
}

// lockSlow is Lock's other cases, out of line so that Lock inlines: the
// lock for concurrent use (a compare-and-swap when it is free), or a
// collision in sequential mode, which is recorded. Both wait for the other
// goroutine to let go (the loads are atomic here, off the fast path, so that
// the loop sees the other goroutine's store).
func (m *Mutex) lockSlow() {
	if m.seq == nil {
		if atomic.CompareAndSwapUint32(&m.held, 0, 1) {
			return
		}
	} else {
		m.seq.collided = true
	}
	for i := 1; ; i++ {
		if atomic.LoadUint32(&m.held) == 0 && atomic.CompareAndSwapUint32(&m.held, 0, 1) {
			if i > spinYields {
				atomic.AddUint32(&m.starving, ^uint32(0))
			}
			return
		}
		switch {
		case i < spinYields:
			runtime.Gosched()
		case i == spinYields:
			// From now on TryLock fails, so that a goroutine that takes m
			// again and again with it (a polling loop) lets this one in.
			atomic.AddUint32(&m.starving, 1)
			fallthrough
		default:
			time.Sleep(sleepEvery)
		}
	}
}

// TryLock locks m if it is free and reports whether it did. In sequential
// mode a TryLock that finds m taken is the owner's own nested call (a
// handler polling from inside a poll), not a collision.
func (m *Mutex) TryLock() bool {
	if m.seq == nil {
		return atomic.LoadUint32(&m.held)|atomic.LoadUint32(&m.starving) == 0 && atomic.CompareAndSwapUint32(&m.held, 0, 1)
	}
	if m.held != 0 {
		return false
	}
	m.held = 1
	return true
}

// Unlock unlocks m: a plain store, with release order outside a sequential
// mode.
func (m *Mutex) Unlock() {
	if m.seq != nil {
		m.held = 0
		return
	}
	release.Store32(&m.held, 0)
}
