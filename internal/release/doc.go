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
// The race detector cannot see a store made in assembly, so race builds use
// the atomic store (release_other.go), and readers must always load with
// sync/atomic.
package release
