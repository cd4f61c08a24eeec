// Package futex puts a thread to sleep on a 32-bit word until another thread
// or process changes it, with Linux's futex(2) (FUTEX_WAIT / FUTEX_WAKE without
// FUTEX_PRIVATE_FLAG, so that the word may live in memory that several
// processes map), and builds a doorbell on it.
//
// A Doorbell is two words in memory shared by one receiver and any number of
// senders: a sequence word that sleepers wait on and a count of sleepers.
// Senders first publish their data (for example a ring record), then call Ring,
// which costs one load while nobody sleeps and a futex wake otherwise.
// The receiver calls Wait, which spins on the caller's readiness check for a
// bounded time, then announces that it sleeps, checks again and sleeps on the
// sequence word with a timeout.
//
// # Why no wake-up is lost
//
// The receiver runs: s := seq; waiters++; if ready() { return }; futex_wait(seq, s).
// A sender runs: publish; if waiters != 0 { seq++; futex_wake(seq) }.
// All of these are sync/atomic operations, which are sequentially consistent.
// Either the receiver's ready() observes the publication, or the publication
// comes after it in that order, and then the sender's load of waiters comes
// after the receiver's increment, sees it, and bumps seq. The bump comes after
// the receiver read s, so futex_wait either finds seq != s and returns at once
// or is already queued and is woken (the kernel checks the value and queues the
// waiter atomically with respect to wakes).
//
// The sender's publication need not be a sequentially consistent store: where
// internal/membarrier is Enabled, Wait runs membarrier.Heavy between its
// increment and its last ready(), the heavy side of an asymmetric barrier, so
// a sender may publish with a release store and load waiters with no fence
// between (the argument is in package membarrier). Elsewhere the sender must
// put a full barrier between the two (ring.Producer.Fence).
//
// On virtual machines whose idle vCPUs halt, a futex wake-up costs tens of
// microseconds, so a receiver should spin 10-20 us before it sleeps
// (docs/performance.md).
package futex
