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
// A client that breaks its promise is caught where that can be cheap: a
// Lock that finds the flag set (which in sequential mode can only be
// another goroutine inside the lock, since the owner's code never locks
// twice) records the collision in the shared Seq, and waits for the flag
// to clear before going on, so that the common collision costs no
// corruption; the layer reports Seq.Collided as an error at its next call.
// Two goroutines that both find the flag clear at once are not caught this
// way; under the race detector the flag's plain accesses are themselves a
// reported race, so a test of the misuse fails there.
package locks

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Seq is the promise of one layer's client to make one call at a time, and
// what its mutexes found. The zero value is not sequential.
type Seq struct {
	on       bool
	collided atomic.Bool
}

// NewSeq returns the sequential mode of one layer instance: its mutexes
// given to SetSeq become plain flags.
func NewSeq() *Seq { return &Seq{on: true} }

// Collided reports whether a mutex of this mode was found taken by another
// goroutine: the client broke its promise.
func (s *Seq) Collided() bool { return s != nil && s.collided.Load() }

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

// Lock locks m.
func (m *Mutex) Lock() {
	if m.seq == nil {
		m.mu.Lock()
		return
	}
	if m.held != 0 {
		m.collide()
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
	if m.seq == nil {
		m.mu.Unlock()
		return
	}
	m.held = 0
}

// collide records that another goroutine holds m in sequential mode and
// waits for it to let go (the loads are atomic here, off the fast path, so
// that the loop sees the other goroutine's store).
func (m *Mutex) collide() {
	m.seq.collided.Store(true)
	for atomic.LoadUint32(&m.held) != 0 {
		runtime.Gosched()
	}
}
