// Package release publishes a word with a release store: on amd64 a plain MOV
// (x86-64's total store order never lets a store pass an earlier one, so a
// reader that loads the word atomically and sees the new value also sees every
// store before it), elsewhere and under the race detector Go's atomic store.
//
// Go's atomic Store is an XCHG on amd64, a full barrier: it drains the store
// buffer and must own the word's cache line before it completes. Where the
// writer only publishes (a ring record, a request's completion) and never
// next loads a word another thread writes (a Dekker pattern: publish, then
// check whether the reader sleeps), the full barrier buys nothing; where it
// does, the caller fences explicitly (ring.Producer.Fence).
//
// On amd64 Store64 and Store32 are ordinary Go stores, inlined where they are
// called (a call to an assembly function costs some twenty instructions
// around its one MOV: the caller's live registers spilled and reloaded).
// The gc compiler threads every store through one chain of memory states and
// schedules each load of a state before the store that ends it, so it never
// moves a store past an earlier load or store of the same goroutine; what it
// may do is drop a store as dead when a later store to the same word follows
// in the same basic block with no load between. For a word whose latest
// value is all a reader needs (a ring position, a completion flag, a lock
// word) that is harmless. A sequence lock's odd count, overwritten by the even
// one after the protected words, is not: it uses Kept64, a call the compiler
// cannot see into.
//
// The race detector cannot see these stores as atomic, so race builds use
// the atomic store (release_other.go), and readers must always load with
// sync/atomic.
package release
