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
package locks

import (
	"runtime"
	"sync"
	"sync/atomic"
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

// Mutex is a sync.Mutex, or a plain flag once SetSeq has put it in a
// sequential mode. The zero value is an unlocked sync.Mutex.
type Mutex struct {
	mu   sync.Mutex
	seq  *Seq
	held uint32 // sequential mode: 1 while locked
}

// SetSeq puts m in sequential mode s (nil: back to a sync.Mutex). Call it
// before m is first used and never while m is locked.
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

// lockSlow is Lock's other cases, out of line so that Lock inlines: a real
// mutex, or a collision in sequential mode, which is recorded and waits for
// the other goroutine to let go (the loads are atomic here, off the fast
// path, so that the loop sees the other goroutine's store).
func (m *Mutex) lockSlow() {
	if m.seq == nil {
		m.mu.Lock()
		return
	}
	m.seq.collided = true
	for atomic.LoadUint32(&m.held) != 0 {
		runtime.Gosched()
	}
	m.held = 1
}

// TryLock locks m if it is free and reports whether it did. In sequential
// mode a TryLock that finds m taken is the owner's own nested call (a
// handler polling from inside a poll), not a collision.
func (m *Mutex) TryLock() bool {
	if m.seq == nil {
		return m.mu.TryLock()
	}
	if m.held != 0 {
		return false
	}
	m.held = 1
	return true
}

// Unlock unlocks m.
func (m *Mutex) Unlock() {
	if m.seq != nil {
		m.held = 0
		return
	}
	m.unlockMu()
}

// unlockMu unlocks the real mutex, out of line so that Unlock inlines.
//
//go:noinline
func (m *Mutex) unlockMu() { m.mu.Unlock() }
